"""What a failed test leaves running is stopped before the next test starts.

A test that asserts "nothing left" does so when it passes; one that fails half-way (an assertion
while its run or sweep still trains) would leave the run's ranks, a sweep's driver thread or a
SLURM job array training beside every later test, slowing the rest of the suite on two cores (one
such leftover made a CI run 40% longer).  After a failed test this stops the sweeps it started in
this process, the processes whose command line names its tmp_path, and the SLURM jobs whose batch
script lies there.  Tests still assert nothing is left themselves; this only keeps a failure from
spreading."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any


def sweeps_started(monkeypatch: Any) -> list[Any]:
    """Record every Sweep this process starts while the test runs."""
    from workbench.sweeps.driver import Sweep

    started: list[Any] = []
    original = Sweep.start

    def start(self: Any, background: bool = True) -> Any:
        started.append(self)
        return original(self, background)

    monkeypatch.setattr(Sweep, "start", start)
    return started


def stop_what_is_left(folder: Path | None, sweeps: list[Any]) -> list[str]:
    """Stop the sweeps, processes and SLURM jobs of a failed test; returns what was stopped."""
    stopped = []
    for sweep in sweeps:
        try:
            if not sweep.done:
                sweep.cancel()
                stopped.append(f"sweep {sweep.folder}")
        except Exception as exc:  # noqa: BLE001 - a failed test's sweep may be in any state
            stopped.append(f"sweep {sweep.folder}: cancel failed: {exc}")
    if folder is None:
        return stopped
    if shutil.which("squeue"):
        out = subprocess.run(["squeue", "-h", "-o", "%A %o"], capture_output=True, text=True, timeout=30)
        jobs = [line.split()[0] for line in out.stdout.splitlines() if str(folder) in line]
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True, timeout=30)
            stopped.append(f"SLURM jobs {' '.join(jobs)}")
    from tests.support.lifecycle import naming

    for pid in naming(folder):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                stopped.append(f"pid {pid}")
            except OSError:
                pass
    return stopped
