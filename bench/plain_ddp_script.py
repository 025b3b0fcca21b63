"""A plain torchrun-style DDP training script (no workbench import): an MLP on synthetic data.
Times its steps after a warm-up and rank 0 writes samples/s to OUT.json (argv[1])."""
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out, steps, warmup, batch = sys.argv[1], int(sys.argv[2]), 30, 64
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(dist.get_rank())
data = [(torch.randn(batch, 256, generator=gen), torch.randint(0, 16, (batch,), generator=gen)) for _ in range(32)]
for step in range(steps + warmup):
    if step == warmup:
        dist.barrier()
        start = time.perf_counter()
    x, y = data[step % len(data)]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
elapsed = time.perf_counter() - start
if dist.get_rank() == 0:
    with open(out, "w") as fh:
        json.dump({"samples_per_s": steps * batch * dist.get_world_size() / elapsed,
                   "threads": torch.get_num_threads()}, fh)
dist.destroy_process_group()
