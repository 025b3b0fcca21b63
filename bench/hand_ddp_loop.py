"""A minimal hand-written DDP loop (the baseline the benchmarks compare with), run by torchrun.

DistributedSampler, DDP with torch's defaults (unless --bucket-cap-mb / --gradient-as-bucket-view),
AdamW, no logging.  Reads the torchrun environment.

Latency mode (no --out; bench/launch_latency.py, bench/warm_pool.py): 5 small steps, rank 0 writes
the wall time of its first finished step to $FIRST_STEP_FILE.

Throughput mode (bench/engine_throughput.py): the engine bench's job (--dim/--hidden/--classes,
--n-train, --batch, gradient clipping), --steps steps over as many epochs as needed; rank 0 writes
{"times": [wall time at the end of each step], "pid": ..., "threads": ...} to --out."""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workbench.engine.builtin_tasks import synthetic_classification

parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--n-train", type=int, default=4096)
parser.add_argument("--n-val", type=int, default=512)
parser.add_argument("--dim", type=int, default=32)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--classes", type=int, default=4)
parser.add_argument("--clip", type=float)
parser.add_argument("--bucket-cap-mb", type=float)  # torch's default: 25 MiB buckets, the first one 1 MiB
parser.add_argument("--gradient-as-bucket-view", action="store_true")  # torch's default: off
args, _ = parser.parse_known_args()  # under submitit (launch_latency) argv is submitit's own

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
dist.init_process_group("gloo")
torch.manual_seed(0)
task = synthetic_classification(n_train=args.n_train, n_val=args.n_val, dim=args.dim, hidden=args.hidden,
                                classes=args.classes)
model = DDP(task.model, bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=args.gradient_as_bucket_view)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)  # the engine's default weight decay
sampler = DistributedSampler(task.train_dataset, shuffle=True, drop_last=True)
loader = DataLoader(task.train_dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
times: list[float] = []
step, epoch = 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = task.loss_fn(model(x), y)
        loss.backward()
        if args.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.time())
        if step == 0 and dist.get_rank() == 0 and "FIRST_STEP_FILE" in os.environ:
            Path(os.environ["FIRST_STEP_FILE"]).write_text(str(times[0]))
        step += 1
        if step == args.steps:
            break
    epoch += 1
if args.out and dist.get_rank() == 0:
    Path(args.out).write_text(json.dumps({"times": times, "pid": os.getpid(), "threads": torch.get_num_threads()}))
dist.destroy_process_group()
