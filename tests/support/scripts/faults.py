"""A plain torchrun-style DDP script that goes wrong on purpose, as user scripts do.

    faults.py raise RANK       RANK raises ValueError in its loss after a few steps ("both": every rank)
    faults.py hang RANK        RANK hangs in its loss (in Python, its threads alive) after a few steps
    faults.py hang-unlogged RANK   the same, in a script that never calls workbench.log: it has no step
    faults.py skip RANK        no workbench.log, prints without flush: RANK skips one of the all_reduces every
                               rank makes each step, so at the end it waits at the barrier while the others
                               wait in their last all_reduce (different collectives at one number)
    faults.py print GATE       rank 0 prints to stdout and stderr in turn, then "ready", all without flush,
                               then waits until the file GATE exists
    faults.py train STEPS      trains STEPS steps, logging each (workbench.log)
    faults.py graceful GATE    every rank prints a line a step without flush, rank 0 "ready" at step 3 and
                               GATE is touched by then; its own SIGTERM handler saves (prints, no flush) and
                               exits 0, as scripts handling preemption do
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import workbench

mode, arg = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))


def loss_fn(output, step):
    if mode == "raise" and step == 5 and arg in (str(rank), "both"):
        raise ValueError(f"injected failure on rank {rank}")
    if mode.startswith("hang") and step == 5 and arg == str(rank):
        while True:  # a bug that never returns: the other ranks wait in the gradient all-reduce
            time.sleep(0.05)
    return output.sum()


if mode == "graceful":
    import signal

    def save_and_leave(signum, frame):
        print(f"rank {rank} got signal {signum}, saving checkpoint")  # no flush, as user scripts print
        print(f"rank {rank} checkpoint saved")
        sys.exit(0)

    signal.signal(signal.SIGTERM, save_and_leave)
    for step in range(1, 100_000):
        print(f"rank {rank} step {step}")
        if step == 3 and rank == 0:
            print("ready")
        time.sleep(0.1)
elif mode == "print":
    if rank == 0:
        for i in range(2):
            print(f"out {i}")  # no flush: as nanoGPT and the PyTorch examples print
            time.sleep(0.1)
            print(f"err {i}", file=sys.stderr)
            time.sleep(0.1)
        print("ready")
        while not os.path.exists(arg):
            time.sleep(0.02)
    dist.barrier()
elif mode == "skip":
    for step in range(1, 101):
        metric = torch.ones(1) * step
        if not (step == 5 and arg == str(rank)):  # a rank that skips a collective (its batch was empty, say)
            dist.all_reduce(metric)  # all ranks must reach this, every step
        print(f"step {step} metric {metric.item()}")  # no flush, as user scripts print
        time.sleep(0.02)
    dist.barrier()  # RANK gets here one collective early: the others still wait in their last all_reduce
else:
    steps = int(arg) if mode == "train" else 1000
    for step in range(1, steps + 1):
        loss = loss_fn(model(torch.randn(4, 8)), step)
        loss.backward()
        if mode != "hang-unlogged":
            workbench.log(step=step, loss=loss.item())
        time.sleep(0.02)
dist.destroy_process_group()
