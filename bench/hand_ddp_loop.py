"""A minimal hand-written DDP loop (the baseline the benchmarks compare with).

Reads the torchrun environment; rank 0 writes the wall time of its first finished step to
$FIRST_STEP_FILE."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workbench.engine.builtin_tasks import synthetic_classification

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
task = synthetic_classification(n_train=4096)
model = DDP(task.model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sampler = DistributedSampler(task.train_dataset, shuffle=True, drop_last=True)
for step, (x, y) in enumerate(DataLoader(task.train_dataset, batch_size=32, sampler=sampler, drop_last=True)):
    loss = task.loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step == 0 and dist.get_rank() == 0:
        Path = __import__("pathlib").Path
        Path(os.environ["FIRST_STEP_FILE"]).write_text(str(time.time()))
    if step == 4:
        break
dist.destroy_process_group()
