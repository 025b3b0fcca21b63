"""One element of a sweep's SLURM job array, run by submitit on every rank (SLURM task) of the element.

The elements of an array are alike: which trial one runs is decided when it starts, not when the
array is submitted (TPE samples a trial's values from the results of the trials before it).  So
the element's rank 0 says it started ("waiting" marker in the sweep folder), every rank waits for
the driver's answer ("bound": the trial's run folder, prepared as any run's), then each rank is that
rank of the trial's run (workbench.engine.entry.RankEntry): an ordinary run with its own folder,
status, logs and Run handle.  An answer without a run folder (nothing left to run, the sweep
cancelled or finished) ends the element at once."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import submitit

from workbench.engine.entry import RankEntry
from workbench.engine.rendezvous import RankContract
from workbench.runfolder.layout import SweepDir, read_json, write_json_atomic

WAIT_POLL_S = 0.2
"""How often a waiting element looks for the driver's answer."""


class SweepElement(submitit.helpers.Checkpointable):
    """An array element: wait to be bound to a trial, then be this rank of the trial's run.  As a
    Checkpointable, a preempted element is requeued and runs the same trial again (its answer is
    kept), from the run's latest checkpoint."""

    def __init__(self, sweep_dir: str, contract: RankContract, max_restarts: int = 0):
        self.sweep_dir, self.contract, self.max_restarts = sweep_dir, contract, max_restarts

    def __call__(self) -> dict[str, Any]:
        env = submitit.JobEnvironment()
        folder, job_id = SweepDir(self.sweep_dir), str(env.job_id)
        if env.global_rank == 0:
            say_waiting(folder, job_id)
        bound = wait_bound(folder, job_id)
        if not bound.get("run_dir"):
            return {"trial": None, "why": bound.get("why", "")}
        return RankEntry(str(bound["run_dir"]), self.contract, self.max_restarts)()


def say_waiting(folder: SweepDir, job_id: str) -> None:
    """Tell the driver this element started (rank 0 only: one marker per element)."""
    folder.elements.mkdir(mode=0o700, exist_ok=True)
    write_json_atomic(folder.element(job_id, "waiting"),
                      {"job_id": job_id, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})


def wait_bound(folder: SweepDir, job_id: str) -> dict[str, Any]:
    """The driver's answer for this element; without one, "nothing" once the sweep is over (the
    element's time limit bounds the wait when no driver comes back)."""
    answer = folder.element(job_id, "bound")
    while True:
        bound = read_json(answer) if answer.exists() else None
        if bound is not None:
            return dict(bound)
        meta = folder.read_meta() or {}
        for ended in ("cancelled", "finished"):
            if meta.get(ended):
                return {"run_dir": None, "why": f"the sweep {ended}"}
        time.sleep(WAIT_POLL_S)
