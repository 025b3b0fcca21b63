import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import workbench

p = argparse.ArgumentParser(); p.add_argument("--steps", type=int, default=20); a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(1, a.steps + 1):
    x = torch.randn(16, 8, generator=g); y = x.sum(1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    workbench.log(step=step, loss=loss)

if os.environ.get("FAIL_ON_RANK") == str(rank):
    raise ValueError(f"script failed on rank {rank}")
dist.destroy_process_group()
