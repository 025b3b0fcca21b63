"""Steady-state training throughput: the workbench engine vs a hand-written minimal DDP loop.

Same model, data, batch, optimizer and launcher (submitit LocalExecutor, 2 ranks, gloo, CPU,
1 thread per rank), run alternately in one process so both see the same machine load.  The engine
logs every step (a JSONL record and a loss all-reduce); the hand-written loop logs nothing.
Throughput is taken from the median wall time of a whole loop iteration after a warm-up, which
is robust to other work on a shared 2-core machine; rounds alternate and the median ratio counts.

    python bench/engine_throughput.py [--rounds 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import submitit

import workbench
from workbench.config import JobConfig
from workbench.engine.rendezvous import free_port

TASK = {"n_train": 65536, "n_val": 64, "dim": 256, "hidden": 1024, "classes": 16}
BATCH, WARMUP = 64, 30


def config(root: str, steps: int) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": TASK},
        "train": {"micro_batch_size": BATCH, "max_steps": steps, "lr": 1e-3, "grad_clip_norm": 1.0,
                  "log_every_steps": 1, "checkpoint_every_steps": 100000},
        "dist": {"procs_per_node": 2}, "launch": {"run_root": root, "time_limit": "20"},
    })


def engine_rate(root: str, steps: int) -> float:
    run = workbench.submit(config(root, steps))
    run.wait(timeout=600)
    frame = run.metrics()
    times = frame[(frame["rank"] == 0) & (frame["step"] >= WARMUP)].sort_values("step")["time"]
    return BATCH * 2 / statistics.median(times.diff().dropna())


def hand_written(port: int, steps: int) -> float:
    """The minimal DDP loop: DistributedSampler, DDP, AdamW, clip, no logging."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from workbench.engine.builtin_tasks import synthetic_classification

    env = submitit.JobEnvironment()
    os.environ.update(RANK=str(env.global_rank), WORLD_SIZE=str(env.num_tasks), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    task = synthetic_classification(**TASK)
    model = DDP(task.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(task.train_dataset, shuffle=True, drop_last=True)
    loader = iter(DataLoader(task.train_dataset, batch_size=BATCH, sampler=sampler, drop_last=True))
    durations = []
    last = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = next(loader)
        loss = task.loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        if step > WARMUP:
            durations.append(now - last)
        last = now
    rate = BATCH * 2 / statistics.median(durations)
    dist.destroy_process_group()
    return rate


def hand_rate(root: str, steps: int) -> float:
    executor = submitit.LocalExecutor(folder=os.path.join(root, "hand"))
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=20)
    return executor.submit(hand_written, free_port(), steps).results()[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ratios = []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.rounds):
            hand, engine = hand_rate(root, args.steps), engine_rate(root, args.steps)
            ratios.append(engine / hand)
            print(f"round {i + 1}: hand-written {hand:9.0f} samples/s   engine {engine:9.0f} samples/s   "
                  f"ratio {engine / hand:.3f}", flush=True)
    print(f"median ratio engine / hand-written: {statistics.median(ratios):.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
