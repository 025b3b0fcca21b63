"""A torchrun-style script that a sweep runs (tests/ddp/test_sweep.py): the metric it logs is
1000 x --lr, all-reduced over the ranks, so each trial's value says which --lr it was given.
--log names the metric (a sweep on another metric finds none); --gate FILE holds the last step
until FILE exists (a trial that cannot end before the test lets it)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

import workbench

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.5)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--log", default="score")
p.add_argument("--gate", default="")
a = p.parse_args()
dist.init_process_group("gloo")
for step in range(1, a.steps + 1):
    while step == a.steps and a.gate and not os.path.exists(a.gate):
        time.sleep(0.05)
    lr = torch.tensor([a.lr])
    dist.all_reduce(lr)  # every rank reaches this: the ranks agree on the --lr they were given
    workbench.log(step=step, **{a.log: 1000 * lr.item() / dist.get_world_size()})
dist.destroy_process_group()
