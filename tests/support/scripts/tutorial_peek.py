"""The PyTorch DDP tutorial's pattern: peek at one batch first, then set_epoch every epoch (correct)."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import workbench

dist.init_process_group("gloo")
data = TensorDataset(torch.arange(64.0))
sampler = DistributedSampler(data, shuffle=True)
loader = DataLoader(data, batch_size=8, sampler=sampler)
first = next(iter(loader))  # a peek: an unfinished pass
step = 0
for epoch in range(3):
    sampler.set_epoch(epoch)
    for (x,) in loader:
        step += 1
        workbench.log(step=step, loss=float(x.mean()))
dist.barrier()  # all ranks must reach this before the group is torn down
dist.destroy_process_group()
