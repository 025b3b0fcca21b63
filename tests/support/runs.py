"""Run folders written as the ranks write them (no processes), small configs, and readers of what a
run exported."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from workbench.config import JobConfig
from workbench.engine.monitor import RankMonitor
from workbench.engine.tasks import build_task
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.writer import JsonlWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny_cfg(tmp_path: Path, **train) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"options": {"n_train": 512, "n_val": 64}},
        "train": {"micro_batch_size": 16, "max_steps": 20, **train},
        "dist": {"procs_per_node": 2},
        "launch": {"run_root": str(tmp_path)},
    })


def local_cfg(root: Path, **train) -> JobConfig:
    """The 2-rank job of tests/ddp/test_local_runs.py (40 steps, a checkpoint every 10, cosine schedule with
    warm-up, parameter checks every 10 steps); the `finished_run` fixture (tests/ddp/conftest.py) runs it once."""
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 2048, "n_val": 256, "dropout": 0.1}},
        "train": {"micro_batch_size": 16, "max_steps": 40, "checkpoint_every_steps": 10, "lr": 1e-2,
                  "schedule": "cosine", "warmup_steps": 5, **train},
        "dist": {"procs_per_node": 2, "timeout_s": 60, "check_every_steps": 10},
        "launch": {"run_root": str(root / "runs"), "time_limit": "10"},
    })


def write_run(root: Path, name: str, world: int, rule: str, steps: int = 40, final: str = "finished") -> Path:
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8}, "scaling": {"rule": rule},
                               "dist": {"procs_per_node": world}, "launch": {"run_root": str(root)}})
    run = RunDir(root / name).prepare(cfg, "local")
    t0 = time.time() - 100
    events = JsonlWriter(run.events(0))
    events.write({"event": "start", "rank": 0, "time": t0, "total_steps": steps, "effective_batch": 8 * world,
                  "lr": 1e-3 * world, "world_size": world})
    for rank in range(world):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, steps + 1):
            loss = 2.0 / (step * world) + 0.1
            writer.write({"rank": rank, "step": step, "time": t0 + step, "loss": loss, "loss_reduced": loss})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": final, "step": steps, "time": time.time()})
    for step in (20, 40):
        events.write({"event": "eval", "rank": 0, "step": step, "time": t0 + step, "val_loss": 1.0 / (step * world),
                      "val_accuracy": 0.5 + step / 100})
    events.close()
    if final == "finished":
        write_json_atomic(run.summary, {"status": "finished"})
    return run.root


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run_folder(tmp_path: Path, world: int = 2, steps: int = 50, **train) -> RunDir:
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8, **train}, "dist": {"procs_per_node": world},
                               "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local", job_id=str(os.getpid()))  # this process: "live"
    t0 = time.time() - steps * 0.1
    for rank in range(world):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, steps + 1):
            writer.write({"rank": rank, "step": step, "time": t0 + 0.1 * step, "loss": 2.0 / step + 0.01 * rank,
                          "loss_reduced": 2.0 / step, "lr": 1e-3, "step_time_s": 0.1, "mem_mb": 100.0})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "running", "step": steps, "time": time.time()})
    return run


def fail_building(tmp_path, factory) -> Run:
    cfg = JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    monitor = RankMonitor(run, 0, 1).start()
    with pytest.raises((TypeError, KeyError)), monitor.reporting():  # what run_rank does around the task
        build_task(factory, {})
    return Run(run.root)


def frame_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
