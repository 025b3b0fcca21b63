"""A minimal hand-written DDP loop (the baseline the benchmarks compare with), run by torchrun.

DistributedSampler, DDP with torch's defaults (unless --bucket-cap-mb / --gradient-as-bucket-view),
AdamW, no logging.  Reads the torchrun environment; a GPU per rank and NCCL where CUDA is there,
else CPU and gloo (the engine's own choice: workbench.engine.env.pick_device_and_backend).

Latency mode (no --out; bench/launch_latency.py, bench/warm_pool.py): 5 small steps, rank 0 writes
the wall time of its first finished step to $FIRST_STEP_FILE.

Throughput mode (bench/engine_throughput.py, bench/gpu_check.py): the engine bench's job
(--dim/--hidden/--classes, --n-train, --batch, gradient clipping), or the built-in charlm (--task
charlm, --block-size/--d-model/--n-head/--n-layer), --steps steps over as many epochs as needed;
--precision bf16 or fp16 (with a GradScaler) as the engine's train.precision does it; --strategy
fsdp2 shards the model with torch's fully_shard instead of DDP (each repeated block, then the root).
Rank 0 writes {"times": [wall time at the end of each step], "losses": [its first --losses losses],
"peak_mb": ..., "pid": ..., "threads": ...} to --out."""

import argparse
import contextlib
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workbench.engine.builtin_tasks import char_lm, synthetic_classification
from workbench.engine.env import pick_device_and_backend

parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--task", choices=("synthetic", "charlm"), default="synthetic")
parser.add_argument("--n-train", type=int, default=4096)
parser.add_argument("--n-val", type=int, default=512)
parser.add_argument("--dim", type=int, default=32)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--classes", type=int, default=4)
parser.add_argument("--block-size", type=int, default=32)
parser.add_argument("--d-model", type=int, default=32)
parser.add_argument("--n-head", type=int, default=2)
parser.add_argument("--n-layer", type=int, default=1)
parser.add_argument("--clip", type=float)
parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
parser.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp")
parser.add_argument("--losses", type=int, default=0, help="rank 0 writes its first this many losses")
parser.add_argument("--bucket-cap-mb", type=float)  # torch's default: 25 MiB buckets, the first one 1 MiB
parser.add_argument("--gradient-as-bucket-view", action="store_true")  # torch's default: off
args, _ = parser.parse_known_args()  # under submitit (launch_latency) argv is submitit's own


def shard(model: torch.nn.Module, device_type: str) -> torch.nn.Module:
    """FSDP2 as its docs apply it: every block of the model's ModuleLists its own unit, the root last."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for blocks in [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]:
        for block in blocks:
            fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
device, backend = pick_device_and_backend(int(os.environ.get("LOCAL_RANK", "0")))
if device.startswith("cuda"):
    torch.cuda.set_device(device)
dist.init_process_group(backend)
torch.manual_seed(0)
if args.task == "charlm":
    task = char_lm(block_size=args.block_size, d_model=args.d_model, n_head=args.n_head, n_layer=args.n_layer)
else:
    task = synthetic_classification(n_train=args.n_train, n_val=args.n_val, dim=args.dim, hidden=args.hidden,
                                    classes=args.classes)
device_type = device.split(":")[0]
if args.strategy == "fsdp2":
    model = shard(task.model.to(device), device_type)
else:
    model = DDP(task.model.to(device), device_ids=[device] if device_type == "cuda" else None,
                bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=args.gradient_as_bucket_view)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)  # the engine's default weight decay
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
autocast = (lambda: torch.autocast(device_type, dtype=dtype)) if dtype else contextlib.nullcontext
scaler = torch.amp.GradScaler(device_type, enabled=args.precision == "fp16")
sampler = DistributedSampler(task.train_dataset, shuffle=True, drop_last=True)
loader = DataLoader(task.train_dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
times: list[float] = []
losses: list[torch.Tensor] = []  # kept on the device: read once at the end, no host sync per step
step, epoch = 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            loss = task.loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if args.clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        times.append(time.time())
        if step < args.losses:
            losses.append(loss.detach().float())
        if step == 0 and dist.get_rank() == 0 and "FIRST_STEP_FILE" in os.environ:
            Path(os.environ["FIRST_STEP_FILE"]).write_text(str(times[0]))
        step += 1
        if step == args.steps:
            break
    epoch += 1
if device_type == "cuda":
    peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
else:
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak RSS (KiB on Linux)
if args.out and dist.get_rank() == 0:
    Path(args.out).write_text(json.dumps({
        "times": times, "losses": torch.stack(losses).tolist() if losses else [], "peak_mb": peak_mb,
        "device": device, "backend": backend, "pid": os.getpid(), "threads": torch.get_num_threads()}))
dist.destroy_process_group()
