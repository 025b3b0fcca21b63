"""Script mode, inside a rank: run an existing torchrun-style script with the run folder's reporting.

The script runs in each rank's process (runpy), with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set as torchrun would, so its own ``init_process_group()`` works unchanged.  One line
streams its metrics into the run's per-rank files:

    import workbench
    workbench.log(step=step, loss=loss.item(), lr=lr)
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from typing import Any

from workbench.engine.monitor import RankMonitor
from workbench.rundir import RunDir, write_json_atomic

RUN_DIR_ENV = "WORKBENCH_RUN_DIR"
_writer: Any = None
_monitor: Any = None  # this rank's RankMonitor when running under run_script_rank


def log(step: int, **metrics: Any) -> None:
    """Append one record (rank, step, time, your metrics) to this rank's metrics file.

    Does nothing when the script was not started by workbench (no WORKBENCH_RUN_DIR)."""
    global _writer
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    rank = int(os.environ.get("RANK", "0"))
    if _writer is None or _writer.path != RunDir(run_dir).metrics(rank):
        from workbench.stream import JsonlWriter

        _writer = JsonlWriter(RunDir(run_dir).metrics(rank))
    values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
    _writer.write({"rank": rank, "step": int(step), "time": time.time(), **values})
    if _monitor is not None:
        _monitor.step = int(step)  # the heartbeat thread reports it


def run_script_rank(script: str, args: list[str], run_dir: str, rank: int, attempt: int = 0) -> int:
    """Run `script` as this rank with sys.argv = [script, *args]; errors land in the run folder."""
    global _monitor
    run = RunDir(run_dir)
    monitor = _monitor = RankMonitor(run, rank, int(os.environ["WORLD_SIZE"]), attempt).start()
    watch_set_epoch(monitor)
    os.environ[RUN_DIR_ENV] = run_dir
    monitor.set_state("running")
    monitor.event("start", script=script, args=args)
    saved_argv = sys.argv
    sys.argv = [script, *args]
    try:
        with monitor.reporting():
            _run_path(script)
    finally:
        sys.argv = saved_argv
    monitor.event("end", stop_reason="script returned")
    monitor.close("finished")
    if rank == 0:
        write_json_atomic(run.summary, {"status": "finished", "script": script, "steps": monitor.step})
    return 0


def watch_set_epoch(monitor: Any) -> None:
    """Report a shuffling DistributedSampler iterated twice with the same epoch: a script that
    forgot sampler.set_epoch(epoch) trains on the same order every epoch."""
    from torch.utils.data import DistributedSampler

    original = DistributedSampler.__iter__
    seen: dict[int, int] = {}
    warned: set[int] = set()

    def __iter__(self: DistributedSampler) -> Any:
        key = id(self)
        if self.shuffle and seen.get(key) == self.epoch and key not in warned:
            warned.add(key)
            monitor.event("warning", check="set_epoch", epoch=self.epoch,
                          message="DistributedSampler iterated again with the same epoch: call "
                                  "sampler.set_epoch(epoch) at the start of every epoch, or each epoch "
                                  "repeats the same order")
        seen[key] = self.epoch
        return original(self)

    DistributedSampler.__iter__ = __iter__  # type: ignore[method-assign]


def _run_path(script: str) -> None:
    """Run the script as __main__; sys.exit(0) is a normal end, another status a failure."""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{script} exited with status {exc.code}") from None
