"""A torchrun-style script that forgets sampler.set_epoch(epoch) between epochs."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import workbench

dist.init_process_group("gloo")
data = TensorDataset(torch.arange(64.0))
sampler = DistributedSampler(data, shuffle=True)
step = 0
for epoch in range(2):
    for (x,) in DataLoader(data, batch_size=8, sampler=sampler):
        step += 1
        workbench.log(step=step, loss=float(x.mean()))
dist.barrier()  # all ranks must reach this before the group is torn down
dist.destroy_process_group()
