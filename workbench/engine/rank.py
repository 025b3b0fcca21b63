"""Entry point of one rank: process group up, task built, train, process group down (always)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

from workbench.config.sections import JobConfig
from workbench.engine.env import DistEnv, join_process_group, pick_device_and_backend
from workbench.engine.mirrors import Mirrors
from workbench.engine.monitor import RankMonitor
from workbench.engine.preempt import PreemptionFlag
from workbench.engine.tasks import build_task, load_task_factory, resolve_factory
from workbench.runfolder import events
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.rankstate import node_name


def run_rank(cfg: JobConfig, run_dir: str, factory: Callable[..., Any] | None = None,
             attempt: int = 0) -> dict[str, Any]:
    """Train this rank (its identity comes from the torchrun environment); returns its summary."""
    import torch
    import torch.distributed as dist

    preempt = PreemptionFlag().install()  # first: a signal during start-up must not be lost
    env = DistEnv.from_environ()
    run = RunDir(run_dir)
    _set_threads(torch, env.local_world_size, cfg.dist.threads_per_rank)
    monitor = RankMonitor(run, env.rank, env.world_size, attempt, stall_after_s=cfg.dist.stall_after_s,
                          lost_after_s=cfg.dist.lost_after_s, on_hang=cfg.dist.on_hang).start()
    monitor.mirrors = Mirrors(cfg, run, env.rank, lambda message: monitor.event(events.WARNING, message=message))
    owned = False
    try:
        with monitor.reporting():
            device, backend = pick_device_and_backend(env.local_rank, cfg.dist.backend)
            if device.startswith("cuda"):
                torch.cuda.set_device(device)
            owned = join_process_group(backend, env, cfg.dist.timeout_s)
            _record_runtime(run, env, device, backend)  # collective: all_gather_object of host names
            summary = _train(cfg, env, device, run, monitor, factory, preempt)
        if summary["stop_reason"] == "preempted":
            monitor.close("requeued")  # the agent hands the job back to the scheduler
            return summary
        monitor.close("finished")
        if env.is_main:
            write_json_atomic(run.summary, {**summary, "status": "finished", "world_size": env.world_size})
        return summary
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()


def _record_runtime(run: RunDir, env: DistEnv, device: str, backend: str) -> None:
    """Rank 0 notes in run.json what the ranks run on: torch, CUDA and NCCL versions, the hosts."""
    import torch
    import torch.distributed as dist

    hosts: list[Any] = [None] * env.world_size
    dist.all_gather_object(hosts, node_name())
    if env.is_main:
        run.update_meta(runtime=runtime_versions(torch) | {"device": device, "backend": backend,
                                                            "hosts": sorted(set(hosts)), "rank_hosts": hosts})


def runtime_versions(torch: Any) -> dict[str, Any]:
    """torch, CUDA and NCCL versions as the rank sees them (None where not built in)."""
    import platform

    nccl = None
    try:
        if torch.distributed.is_nccl_available():
            found = torch.cuda.nccl.version()
            nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
    except Exception:  # noqa: BLE001 - a build without NCCL: nothing to report
        nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "python": platform.python_version()}


def _train(cfg: JobConfig, env: DistEnv, device: str, run: RunDir, monitor: RankMonitor,
           factory: Callable[..., Any] | None, preempt: PreemptionFlag) -> dict[str, Any]:
    import torch

    from workbench.engine.trainer import Trainer

    # Same seed on every rank while building: identical datasets and initial weights.
    _seed(torch, cfg.train.seed)
    task = build_task(factory or load_task_factory(run) or resolve_factory(cfg.task.name), cfg.task.options)
    cfg, resized = continue_at(cfg, run, env.world_size)
    trainer = Trainer(cfg, task, env, device, run, monitor, preempt, resized=resized)
    _seed(torch, cfg.train.seed + env.rank)  # then per rank (dropout, augmentation)
    trainer.resume()
    monitor.set_state("running")
    summary = trainer.fit()
    monitor.event(events.END, stop_reason=summary["stop_reason"], steps=summary["steps"])
    return summary


def continue_at(cfg: JobConfig, run: RunDir, world_size: int) -> tuple[JobConfig, str]:
    """The config a run continues with at this world size, and what changed ("" if nothing): from
    the newest checkpoint's world size and config (workbench.config.scaling.resize)."""
    found = run.checkpoint_files()
    if not found:
        return cfg, ""  # a fresh run: nothing to read, and no torch to import in a submitting process
    from workbench.config.scaling import resize
    from workbench.engine.checkpoint import peek_checkpoint

    for path in reversed(found):
        try:
            state = peek_checkpoint(path)
            old = JobConfig.from_dict(state["config"])
        except Exception:  # noqa: BLE001 - unreadable: resume() skips it too and says so
            continue
        change = resize(old, state["world_size"], cfg, world_size)
        return change.config, change.message
    return cfg, ""


def _seed(torch: Any, seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def _set_threads(torch: Any, local_world_size: int, threads: int | None) -> None:
    """One share of the cores per rank (torchrun sets OMP_NUM_THREADS=1 for the same reason)."""
    if threads:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world_size)))
