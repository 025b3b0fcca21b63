"""CPU time of one training step: the engine's step vs a hand-written DDP step, in the same processes.

Two ranks (gloo, 1 thread each, launched by torchrun) build several variants of the same job side
by side -- the hand-written step (DDP with torch's defaults), the same with the engine's DDP options,
and the engine's own Trainer (its train_step plus the every-N-steps health check, as fit() runs them)
with its observability switched on or off -- and run them in alternating blocks of steps, every
variant's block next to every other's.  A block's CPU time (all threads of the process, and the
main thread alone) is read with time.process_time / time.thread_time, so the figures do not depend
on how much of the machine a rank got: on a shared 2-core machine wall time does, CPU time much less.
The same heap serves every variant, so the malloc behaviour (page faults) is common to all of them:
bench/engine_throughput.py shows that part.  So do the engine variants' heartbeat threads, which
run all along and so count in every block alike: their own CPU per second is printed apart.  Prints
medians per variant and the paired differences.

    python bench/engine_step_cpu.py [--block 100] [--rounds 24] [--variants hand,engine,...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TASK = {"n_train": 65536, "n_val": 64, "dim": 256, "hidden": 1024, "classes": 16}
BATCH = 64
VARIANTS = ("hand", "hand_engine_ddp", "hand_python_hook", "hand_comm_timing", "engine", "engine_no_comm_timing",
            "engine_no_checks", "engine_log_10",
            "engine_torch_ddp", "engine_reduce_each_step", "engine_quiet",
            "hand_fsdp2", "hand_fsdp2_engine_clip", "engine_fsdp2", "engine_fsdp2_torch_clip", "engine_fsdp2_quiet")
"""hand: DDP with torch's defaults; hand_engine_ddp: with the engine's DDP options (one 25 MiB bucket,
gradient_as_bucket_view); hand_python_hook: with torch's own Python all-reduce hook
(default_hooks.allreduce_hook, what a comm hook costs as such); hand_comm_timing: with the engine's
comm-timing hook (workbench.engine.commtiming); engine: the Trainer as configured by default (a record every step, comm
timing, checks every 100 steps); engine_no_comm_timing: dist.measure_comm off; engine_no_checks:
dist.check_every_steps off; engine_log_10: a record every 10 steps; engine_torch_ddp: the engine with
torch's DDP defaults (its bucket_cap_mb and gradient_as_bucket_view as torch has them);
engine_reduce_each_step: the loss all-reduce at every step (as before the reduces were batched); engine_quiet:
comm timing and checks off, a record every 10 steps.
FSDP2 (bench/fsdp_vs_hand.py's sides; not in the default --variants, list them): hand_fsdp2: fully_shard
on the MLP's first Linear then the root, torch's clip_grad_norm_ (bench/hand_fsdp_loop.py's step);
hand_fsdp2_engine_clip: the same with the engine's clip_grad_norm (float64 squares, one all-reduce);
engine_fsdp2: the Trainer with dist.strategy fsdp2; engine_fsdp2_torch_clip: the same with torch's
clip_grad_norm_ in place of the engine's; engine_fsdp2_quiet: fsdp2, checks off, a record every 10 steps."""

FSDP2_VARIANTS = tuple(v for v in VARIANTS if "fsdp2" in v)


def _hand(engine_ddp: bool = False, hook: str = "", fsdp2: bool = False,
          engine_clip: bool = False) -> Callable[[], None]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from workbench.engine.builtin_tasks import synthetic_classification

    torch.manual_seed(0)
    task = synthetic_classification(**TASK)
    options: dict[str, Any] = {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": True} if engine_ddp else {}
    if fsdp2:
        from torch.distributed.fsdp import fully_shard

        fully_shard(task.model[0])  # the unit the engine picks for this MLP (bench/hand_fsdp_loop.py)
        model = fully_shard(task.model)
    else:
        model = DDP(task.model, **options)
    if engine_clip:
        from workbench.engine.strategy import clip_grad_norm
    if hook == "python":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "timing":
        from workbench.engine.commtiming import attach

        timer = attach(model, "none", measure=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sampler: DistributedSampler[Any] = DistributedSampler(task.train_dataset, shuffle=True, drop_last=True)
    loader = DataLoader(task.train_dataset, batch_size=BATCH, sampler=sampler, drop_last=True)

    def batches() -> Iterator[Any]:
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    found = batches()

    def step() -> None:
        x, y = next(found)
        torch.nn.functional.cross_entropy(model(x), y).backward()  # the task's loss_fn
        if hook == "timing":
            timer.take(time.perf_counter())
        if engine_clip:
            clip_grad_norm(model, 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


HEARTBEATS: list[Any] = []  # the engine variants' heartbeat threads: their CPU is measured apart


def _engine(root: Path, torch_ddp: bool = False, reduce_each_step: bool = False, torch_clip: bool = False,
            **dist_and_train: Any) -> Callable[[], None]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from workbench.config import JobConfig
    from workbench.engine import trainer as trainer_module
    from workbench.engine.builtin_tasks import synthetic_classification
    from workbench.engine.data import endless
    from workbench.engine.env import DistEnv
    from workbench.engine.monitor import RankMonitor
    from workbench.engine.trainer import Trainer, _due
    from workbench.runfolder.layout import RunDir

    train = {"micro_batch_size": BATCH, "max_steps": 10**9, "epochs": 10**6, "lr": 1e-3, "grad_clip_norm": 1.0,
             "log_every_steps": dist_and_train.pop("log_every_steps", 1), "checkpoint_every_steps": 10**9}
    cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": TASK}, "train": train,
                               "dist": {"procs_per_node": 2, "threads_per_rank": 1, **dist_and_train}})
    env = DistEnv.from_environ()
    run = RunDir(Path(tempfile.mkdtemp(dir=root)))
    monitor = RankMonitor(run, env.rank, env.world_size).start()
    HEARTBEATS.append(monitor._thread)
    torch.manual_seed(0)
    if torch_ddp:  # the config cannot say "torch's default" for bucket_cap_mb (a 1 MiB first bucket)
        def torch_defaults(module: Any, **options: Any) -> Any:
            options.pop("bucket_cap_mb"), options.pop("gradient_as_bucket_view")
            return DistributedDataParallel(module, **options)

        trainer_module.DDP = torch_defaults  # type: ignore[assignment]
    try:
        trainer = Trainer(cfg, synthetic_classification(**TASK), env, "cpu", run, monitor)
    finally:
        trainer_module.DDP = DistributedDataParallel  # type: ignore[misc]
    if reduce_each_step:
        trainer.steplog.max_every = 1
    engine_clip = trainer_module.clip_grad_norm

    def torch_clip_(module: torch.nn.Module, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)

    clip = torch_clip_ if torch_clip else engine_clip  # the Trainer calls its module's name: set for each step
    monitor.set_state("running")

    found = endless(trainer.loader, 0, env.rank)

    def step() -> None:
        trainer_module.clip_grad_norm = clip  # type: ignore[assignment]
        trainer.train_step(found)
        if _due(trainer.step, cfg.dist.check_every_steps):
            trainer.health.check(trainer.step)  # as fit() does: every check_every_steps steps

    return step


def _build(name: str, root: Path) -> Callable[[], None]:
    return {
        "hand": lambda: _hand(),
        "hand_engine_ddp": lambda: _hand(engine_ddp=True),
        "hand_python_hook": lambda: _hand(hook="python"),
        "hand_comm_timing": lambda: _hand(hook="timing"),
        "engine": lambda: _engine(root),
        "engine_no_comm_timing": lambda: _engine(root, measure_comm=False),
        "engine_no_checks": lambda: _engine(root, check_every_steps=None),
        "engine_log_10": lambda: _engine(root, log_every_steps=10),
        "engine_torch_ddp": lambda: _engine(root, torch_ddp=True),
        "engine_reduce_each_step": lambda: _engine(root, reduce_each_step=True),
        "engine_quiet": lambda: _engine(root, measure_comm=False, check_every_steps=None, log_every_steps=10),
        "hand_fsdp2": lambda: _hand(fsdp2=True),
        "hand_fsdp2_engine_clip": lambda: _hand(fsdp2=True, engine_clip=True),
        "engine_fsdp2": lambda: _engine(root, strategy="fsdp2"),
        "engine_fsdp2_torch_clip": lambda: _engine(root, torch_clip=True, strategy="fsdp2"),
        "engine_fsdp2_quiet": lambda: _engine(root, strategy="fsdp2", check_every_steps=None, log_every_steps=10),
    }[name]()


def rank_main(block: int, rounds: int, names: list[str]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    root = Path(tempfile.mkdtemp(prefix="engine-step-cpu-"))
    steps = {name: _build(name, root) for name in names}
    for name in names:  # warm-up: allocator, autograd, DDP's bucket rebuild
        for _ in range(50):
            steps[name]()
    cpu: dict[str, list[float]] = {name: [] for name in names}
    main: dict[str, list[float]] = {name: [] for name in names}
    beats = [(t, time.clock_gettime(time.pthread_getcpuclockid(t.ident))) for t in HEARTBEATS]
    started = time.monotonic()
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:  # each goes first in turn
            dist.barrier()
            c0, t0 = time.process_time(), time.thread_time()
            for _ in range(block):
                steps[name]()
            cpu[name].append(1000 * (time.process_time() - c0) / block)
            main[name].append(1000 * (time.thread_time() - t0) / block)
    elapsed = time.monotonic() - started
    beat_ms_per_s = [1000 * (time.clock_gettime(time.pthread_getcpuclockid(t.ident)) - c) / elapsed for t, c in beats]
    if dist.get_rank() == 0:
        print(f"CPU ms per step of rank 0, medians over {rounds} blocks of {block} steps "
              f"(load average {os.getloadavg()[0]:.2f}):")
        if beat_ms_per_s:
            print(f"  heartbeat thread (one per engine variant, always running): "
                  f"{statistics.median(beat_ms_per_s):.3f} ms CPU per second each")
        for name in names:
            print(f"  {name:22s} process {statistics.median(cpu[name]):.3f}   "
                  f"main thread {statistics.median(main[name]):.3f}")
        base = names[0]
        for name in names[1:]:
            diff = [a - b for a, b in zip(cpu[name], cpu[base])]
            print(f"  {name} - {base}: {statistics.median(diff):+.3f} ms per step "
                  f"({statistics.median(diff) / statistics.median(cpu[base]):+.1%}), "
                  f"higher in {sum(d > 0 for d in diff)}/{len(diff)} paired blocks")
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # the heartbeat threads and process group go with the process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if v not in FSDP2_VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)}; 'fsdp2' for {', '.join(FSDP2_VARIANTS)}")
    args = parser.parse_args()
    names = list(FSDP2_VARIANTS) if args.variants == "fsdp2" else args.variants.split(",")
    if unknown := set(names) - set(VARIANTS):
        parser.error(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if "RANK" in os.environ:
        rank_main(args.block, args.rounds, names)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
                    *sys.argv[1:]], env=env, check=True)


if __name__ == "__main__":
    main()
