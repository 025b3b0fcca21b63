"""Plans before a launch (workbench.plan): per world size the scaled lr and warmup, each rank's memory
traced on fake tensors, whether it fits, and the predicted speed.  Runs in the submitting process (a
notebook, the CLI); it builds the task from its factory as a rank does, but starts no rank.

    fake.py     building the user's task on fake tensors (nothing allocated): the one place that does
    memory.py   one rank's training step in memory (MemTracker on fake tensors) and a timed real step
    plan.py     the plan's table"""
