"""A minimal hand-written FSDP2 loop (bench/fsdp_vs_hand.py's baseline), run by torchrun.

The engine bench's job (the synthetic MLP dim -> hidden -> classes, DistributedSampler, AdamW,
gradient clipping with torch's own clip_grad_norm_, no logging), the model sharded as FSDP2's docs
apply it: `fully_shard` on each unit, then on the root, torch's defaults otherwise (fp32, reshard
after forward).  The units are the ones the engine picks for this model (dist.fsdp_units empty: no
repeated blocks, so each direct child holding at least 1/8 of the parameters): for the MLP that is
its first Linear (dim x hidden), written out here as a user would; the bench checks that the
engine picks the same.  A GPU per rank and NCCL where CUDA is there, else CPU and gloo.

    torchrun --standalone --nproc_per_node=2 bench/hand_fsdp_loop.py --out FILE [--steps N] ...

Rank 0 writes {"times": [wall time at the end of each step], "units": [paths sharded before the
root], "pid": ..., "threads": ...} to --out."""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from workbench.engine.builtin_tasks import synthetic_classification
from workbench.engine.env import pick_device_and_backend

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--n-train", type=int, default=4096)
parser.add_argument("--n-val", type=int, default=512)
parser.add_argument("--dim", type=int, default=32)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--classes", type=int, default=4)
parser.add_argument("--clip", type=float)
args = parser.parse_args()

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
device, backend = pick_device_and_backend(int(os.environ.get("LOCAL_RANK", "0")))
if device.startswith("cuda"):
    torch.cuda.set_device(device)
dist.init_process_group(backend)
torch.manual_seed(0)
task = synthetic_classification(n_train=args.n_train, n_val=args.n_val, dim=args.dim, hidden=args.hidden,
                                classes=args.classes)
model = task.model.to(device)  # Sequential(Linear(dim, hidden), ReLU, Dropout, Linear(hidden, classes))
units = ["0"]
for path in units:
    fully_shard(model.get_submodule(path))
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)  # the engine's default weight decay
sampler = DistributedSampler(task.train_dataset, shuffle=True, drop_last=True)
loader = DataLoader(task.train_dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
times: list[float] = []
step, epoch = 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = task.loss_fn(model(x), y)
        loss.backward()
        if args.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)  # DTensor gradients: a global norm
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.time())
        step += 1
        if step == args.steps:
            break
    epoch += 1
if dist.get_rank() == 0:
    Path(args.out).write_text(json.dumps({"times": times, "units": units, "device": device, "backend": backend,
                                          "pid": os.getpid(), "threads": torch.get_num_threads()}))
dist.destroy_process_group()
