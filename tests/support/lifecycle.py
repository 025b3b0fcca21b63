"""Helpers for the run-lifecycle tests: the run's processes (found by recorded pid or command line),
waiting for a step, and reporting the time from a fault to what the user sees."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from workbench.config import JobConfig
from workbench.proctree import Proc
from workbench.runfolder.layout import PoolDir, RunDir, read_json

OPTIONS = {"n_train": 2048, "n_val": 256}
CLI = [sys.executable, "-m", "workbench.cli"]
ENDLESS = {"epochs": 10**6, "max_steps": 10**9}
"""Train limits no test run reaches: a test that waits for a step and then acts on the run (cancels it,
kills or signals a process) must be what ends it, however slow the machine; it ends the run itself."""
GATED = "tests.support.tasks_for_tests:gated"


def cfg(tmp_path: Path, task: str = "synthetic", options: dict[str, Any] | None = None, **train: Any) -> JobConfig:
    launch = train.pop("launch", {})
    dist = train.pop("dist", {})
    return JobConfig.from_dict({
        "task": {"name": task, "options": {**OPTIONS, **(options or {})}},
        "train": {"micro_batch_size": 16, "epochs": 100, "max_steps": 40, "checkpoint_every_steps": 10, **train},
        "dist": {"procs_per_node": 2, "timeout_s": 120, "threads_per_rank": 1, **dist},
        "launch": {"run_root": str(tmp_path / "runs"), "time_limit": "10", **launch},
    })


def slow_task_cfg(tmp_path: Path, delay_s: float = 0.03, **train: Any) -> JobConfig:
    """A config naming the slowed synthetic task by module (usable from YAML, the CLI, a subprocess)."""
    return cfg(tmp_path, "tests.support.tasks_for_tests:slow", {"delay_s": delay_s}, **train)


def gated_cfg(tmp_path: Path, at_step: int, delay_s: float = 0.0, **train: Any) -> tuple[JobConfig, Path]:
    """A config whose ranks hold before step `at_step` + 1 until the returned gate file exists
    (tasks_for_tests.gated): the run cannot pass `at_step`, nor end by itself, before the test opens it."""
    gate = tmp_path / "gate"
    return cfg(tmp_path, GATED, {"gate": str(gate), "at_step": at_step, "delay_s": delay_s}, **train), gate


def run_processes(folder: Path) -> list[str]:
    """Live processes of the run: recorded (controller, agents, workers) or naming its folder."""
    run = PoolDir(folder) if (Path(folder) / "pool.json").exists() else RunDir(folder)  # a warm pool's too
    recorded = [Proc.from_dict((read_json(run.meta, {}) or {}).get("controller")),
                *run.recorded("agent"), *run.recorded("worker")]
    found = {p.pid: f"{p.pid} (recorded)" for p in recorded if p is not None and p.alive()}
    found.update({pid: f"{pid}: {cmd}" for pid, cmd in naming(folder).items()})
    return sorted(found.values())


def naming(folder: Path) -> dict[int, str]:
    """Live processes (not zombies) whose command line names `folder`: pid -> command line."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(folder) in cmd and state != "Z":
            found[int(pid)] = cmd
    return found


def assert_nothing_left(folder: Path) -> None:
    left = run_processes(folder)
    assert not left, f"processes of the run are left: {left}"


def wait_for_step(run: Any, step: int, timeout: float = 120) -> int:
    """Wait until every rank has reached `step`; returns the step reached.  Each poll is one
    `run.status()`: the ranks' status files (their heartbeat's step) and only the metrics records
    logged since the last poll, never a full metrics read.  A run that ends first fails at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = run.status()
        if status.step >= step:
            return status.step
        if status.done:
            raise AssertionError(f"run {run.folder} ended before step {step}: {status}")
        time.sleep(0.1)
    raise AssertionError(f"run {run.folder} did not reach step {step} in {timeout} s: {run.status()}")


def wait_until(check: Any, timeout: float, what: str) -> float:
    """Poll `check()` until true; returns the seconds it took.  The poll starts at 0.05 s and
    backs off to 0.25 s: a check may load a run or scan /proc (a Run.load and status every 0.05 s
    is 12% of a core), and the suite is CPU-bound on two cores, so a long wait must not steal
    from the test beside it."""
    started, pause = time.monotonic(), 0.05
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    raise AssertionError(f"not within {timeout} s: {what}")


def report(case: str, seconds: float) -> None:
    """The time from a fault to the user seeing it, printed (run with -s) for the record."""
    print(f"\n[fault-to-user] {case}: {seconds:.1f} s", flush=True)


def metric_steps(run: Any) -> list[list[int]]:
    frame = run.metrics()
    return frame.groupby("rank")["step"].apply(list).tolist()


def checkpoint_steps(folder: Path) -> list[int]:
    """Steps of the finished checkpoints that torch can load."""
    import torch

    steps = []
    for path in sorted((folder / "checkpoints").glob("step-*.pt")):
        steps.append(int(torch.load(path, map_location="cpu", weights_only=False)["step"]))
    return steps


def as_from_a_terminal() -> None:
    """The CLI's stop signals as a shell in a terminal leaves them: a suite started under `nohup` (as a
    background CI job may be) passes SIGHUP ignored to every child, and the CLI then rightly leaves SIGHUP
    alone (`nohup workbench run` survives the terminal: tests/unit/test_owner.py), so its SIGHUP case
    waited out its timeout."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
