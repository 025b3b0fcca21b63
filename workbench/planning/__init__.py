"""Plans before a launch (workbench.plan): per world size the scaled lr and warmup, each rank's memory
traced on fake tensors, whether it fits, and the predicted speed.  Runs in the submitting process (a
notebook, the CLI); it builds the task from its factory as a rank does, but starts no training rank
(the link probe starts a few short-lived processes of its own, once per world size and host: probe.py).

    fake.py        building the user's task on fake tensors or the meta device (nothing allocated): the one place
    memory.py      one rank's training step in memory (MemTracker on fake tensors); fsdp2's sharded peak
    compute.py     one micro-batch's compute, timed on real tensors (warm-up, then a median)
    cost.py        the step-time model: a link's latency and bandwidth, DDP's buckets, FSDP2's collectives
    probe.py       the link probe from the submitting side: starts its ranks, caches what they measured
    probe_rank.py  runs inside each probe rank: all-reduce timings and the engine's own work a step
    plan.py        the plan's table"""
