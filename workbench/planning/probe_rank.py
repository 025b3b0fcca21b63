"""Runs inside each rank of the link probe (planning.probe starts them): what a collective and the engine's
own per-step work cost on this host at this world size.

    python -m workbench.planning.probe_rank OUT.json SETTINGS_JSON      (RANK, WORLD_SIZE, MASTER_* set)
    python -m workbench.planning.probe_rank OUT.json SETTINGS_JSON MODEL.pkl

1. all_reduce at two sizes (SMALL_BYTES, LARGE_BYTES), the median of each: planning.cost.fit_link makes the
   per-call latency and the bus bandwidth of them.
2. The engine's own work a step: the real Trainer (its train_step, and the health check as often as fit()
   runs it) on a tiny model, against the same model's bare step (planning.compute.training_step) in the
   same process, alternating blocks, in the main thread's CPU time (on a shared machine, wall time
   differences of a millisecond drown in the other processes' noise; CPU time much less).  What it
   adds is DDP's or FSDP2's bookkeeping, the comm hook, the record, the loss reduce: what a real
   model's step pays beside its compute and its bytes (waiting for a collective costs no CPU: the link
   counts that).
With MODEL.pkl (the plan's config and factory, pickled by planning.probe into its private temporary
folder): instead, the user's own model's step at this world size (model_step), every rank stepping at
once as a run's ranks do on this host, so that they share its cores as the run's will.
Rank 0 writes the result beside OUT and renames it onto OUT (a reader never sees half a file)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMALL_BYTES = 4 * 2**10
LARGE_BYTES = 8 * 2**20
TINY = {"dim": 8, "hidden": 16, "classes": 2, "n_train": 4096, "n_val": 8}
"""The tiny model of the overhead probe: its compute and bytes are small beside the engine's own work."""


def collective_seconds(nbytes: int, repeats: int = 12) -> float:
    """The median time of an all_reduce of `nbytes` (float32), after 3 warm-up calls.  All ranks must
    call this together, with the same arguments."""
    import torch
    import torch.distributed as dist

    buffer = torch.zeros(max(1, nbytes // 4))
    times = []
    for i in range(repeats + 3):
        dist.barrier()  # collective: every rank starts the call together
        began = time.perf_counter()
        dist.all_reduce(buffer)  # collective: the measured one
        if i >= 3:
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def engine_overhead(settings: dict[str, Any], blocks: int = 5, block: int = 10) -> dict[str, float]:
    """The tiny model's engine step and bare step, medians of wall time and of the main thread's CPU time
    (seconds), and its gradient bytes."""
    import torch
    import torch.distributed as dist

    from workbench.config import JobConfig
    from workbench.engine.builtin_tasks import synthetic_classification
    from workbench.engine.data import endless
    from workbench.engine.env import DistEnv
    from workbench.engine.monitor import RankMonitor
    from workbench.engine.trainer import Trainer, _due
    from workbench.planning.compute import training_step
    from workbench.runfolder.layout import RunDir

    cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": TINY},
                               "train": {"micro_batch_size": 4, "max_steps": 10**9, **settings["train"]},
                               "dist": {"procs_per_node": dist.get_world_size(), **settings["dist"]}})
    env = DistEnv.from_environ()
    run = RunDir(Path(tempfile.mkdtemp(prefix="workbench-probe-")))
    monitor = RankMonitor(run, env.rank, env.world_size).start()
    monitor.set_state("running")
    torch.manual_seed(0)
    trainer = Trainer(cfg, synthetic_classification(**TINY), env, "cpu", run, monitor)
    bare_task = synthetic_classification(**TINY)
    bare = training_step(cfg, bare_task, bare_task.model, "cpu")

    found = endless(trainer.loader, 0, env.rank)

    def engine_step() -> None:
        trainer.train_step(found)  # collective: DDP's all-reduce (fsdp2: gathers), the loss reduce
        if _due(trainer.step, cfg.dist.check_every_steps):
            trainer.health.check(trainer.step)  # collective: as fit() runs it

    timed: dict[str, list[float]] = {"engine_step_s": [], "bare_step_s": [], "engine_cpu_s": [], "bare_cpu_s": []}
    for i in range(blocks + 1):  # the first block of each is warm-up
        for name, step in (("engine", engine_step), ("bare", bare)):
            for _ in range(block):
                began, cpu = time.perf_counter(), time.thread_time()
                step()
                if i:
                    timed[f"{name}_step_s"].append(time.perf_counter() - began)
                    timed[f"{name}_cpu_s"].append(time.thread_time() - cpu)
    result = {name: statistics.median(values) for name, values in timed.items()}
    result["tiny_grad_bytes"] = sum(p.numel() * p.element_size() for p in bare_task.model.parameters())
    return result


def model_step(payload: str, bare: bool, budget_s: float = 4.0, warmup: int = 5, least: int = 10,
               most: int = 40) -> dict[str, float]:
    """The engine's real step of the user's model (Trainer.train_step: data, forward, backward with DDP's
    all-reduces or FSDP2's collectives, clip, optimizer, the record and the loss reduce), rank 0's median
    wall time as a run's step_time_s is; then the same model's bare step (planning.compute.training_step,
    no communication) with every rank stepping at once: the compute a rank has when the host's cores are
    shared, for world sizes beyond this host (when `bare`).  `warmup` steps first, then as many as fit in
    `budget_s` (decided once for all ranks: every engine step is a collective).  The window is seconds
    long, as a run's median is: on a shared host the load moves within seconds, and a median of 5 steps
    (1.5 s) missed a run right after it by 3x at load 10."""
    import pickle

    import torch
    import torch.distributed as dist

    from workbench.engine.data import endless
    from workbench.engine.env import DistEnv
    from workbench.engine.monitor import RankMonitor
    from workbench.engine.tasks import build_task
    from workbench.engine.trainer import Trainer, _due
    from workbench.planning.compute import training_step
    from workbench.runfolder.layout import RunDir

    with open(payload, "rb") as fh:  # written by planning.probe into its own mkdtemp folder (mode 0700)
        cfg, factory = pickle.load(fh)
    env = DistEnv.from_environ()
    run = RunDir(Path(tempfile.mkdtemp(prefix="workbench-probe-")))
    monitor = RankMonitor(run, env.rank, env.world_size).start()
    monitor.set_state("running")
    torch.manual_seed(cfg.train.seed)
    trainer = Trainer(cfg, build_task(factory, dict(cfg.task.options)), env, "cpu", run, monitor)
    found = endless(trainer.loader, cfg.train.seed, env.rank)

    def engine_step() -> None:
        trainer.train_step(found)  # collective: the strategy's, the loss reduce
        if _due(trainer.step, cfg.dist.check_every_steps):
            trainer.health.check(trainer.step)  # collective: as fit() runs it

    kinds: list[tuple[str, Callable[[], None]]] = [("step_s", engine_step)]
    if bare:
        bare_task = build_task(factory, dict(cfg.task.options))
        kinds.append(("bare_step_s", training_step(cfg, bare_task, bare_task.model, "cpu")))
    result = {}
    for name, step in kinds:
        began = time.perf_counter()
        for _ in range(warmup):
            step()
        each = torch.tensor([(time.perf_counter() - began) / warmup])
        dist.all_reduce(each, op=dist.ReduceOp.MAX)  # collective: every rank times the same number of steps
        count = int(min(most, max(least, budget_s / max(float(each), 1e-6))))
        dist.barrier()  # collective: the ranks start together, as a run's do
        times = []
        for _ in range(count):
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        result[name] = statistics.median(times)
        result[f"{name.removesuffix('_s')}s"] = count
    return result


def main(out: str, settings_json: str, payload: str | None = None) -> None:
    import torch
    import torch.distributed as dist

    from workbench.engine.trainer import keep_freed_memory

    settings = json.loads(settings_json)
    torch.set_num_threads(settings["threads"])
    keep_freed_memory()  # as a rank's worker does
    dist.init_process_group("gloo")  # collective: every probe rank meets here
    measured: dict[str, Any]
    if payload:
        measured = model_step(payload, settings.get("bare", False))
    else:
        small, large = collective_seconds(SMALL_BYTES), collective_seconds(LARGE_BYTES)
        measured = {"small": [SMALL_BYTES, small], "large": [LARGE_BYTES, large], **engine_overhead(settings)}
    if dist.get_rank() == 0:
        result = {"world_size": dist.get_world_size(), **measured, "load": os.getloadavg()[0]}
        tmp = f"{out}.{os.getpid()}.tmp"
        Path(tmp).write_text(json.dumps(result))
        os.replace(tmp, out)
    dist.barrier()  # collective: no rank leaves before rank 0 wrote
    sys.stdout.flush()
    os._exit(0)  # the monitor's heartbeat thread and the process group go with the process


if __name__ == "__main__":
    main(*sys.argv[1:4])
