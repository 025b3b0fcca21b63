"""A job run by a warm pool, seen from the submitting side: what the Run handle asks a submitit
job (done, state, cancel), answered from the pool folder (workbench.runfolder.layout.PoolDir)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from workbench.proctree import Proc
from workbench.runfolder.layout import PoolDir, read_json
from workbench.runfolder.private import write_atomic


class PoolJob:
    """Job `number` of the pool in `pool`: done when every rank is done with it (or the pool is gone)."""

    def __init__(self, pool: PoolDir, number: int, world_size: int):
        self.pool, self.number, self.world_size = pool, number, world_size
        self.job_id = f"pool-{number}"

    @classmethod
    def from_meta(cls, facts: dict[str, Any], world_size: int) -> PoolJob | None:
        """From run.json's "pool" entry (Run.load on a pool job's folder)."""
        folder, number = facts.get("dir"), facts.get("job")
        if not isinstance(folder, str) or not isinstance(number, int):
            return None
        return cls(PoolDir(Path(folder)), number, world_size)

    def done(self) -> bool:
        if all(self.pool.done(self.number, r).exists() for r in range(self.world_size)):
            return True
        return not pool_alive(self.pool)

    @property
    def state(self) -> str:
        if self.done():
            return "FINISHED"
        taken = [read_json(self.pool.taken(r)) or {} for r in range(self.world_size)]
        return "RUNNING" if any(t.get("job") == self.number for t in taken) else "PENDING"

    def cancel(self) -> None:
        """Cancel this job only: its ranks' workers are ended and the pool starts fresh ones."""
        write_atomic(self.pool.job_cancel(self.number), b"")

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.done():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def outcomes(self) -> list[dict[str, Any]]:
        """Each rank's done record (outcome, memory, exec output), in rank order ({} where none yet)."""
        return [read_json(self.pool.done(self.number, r)) or {} for r in range(self.world_size)]


def pool_alive(pool: PoolDir) -> bool:
    """The pool's job is there: its local controller runs, or its SLURM job is not over."""
    meta = pool.read_meta() or {}
    if meta.get("executor") == "slurm":
        return slurm_job_alive(pool, str(meta.get("job_id") or ""))
    controller = Proc.from_dict(meta.get("controller"))
    return controller is not None and controller.alive()


_SLURM_SEEN: dict[str, tuple[float, bool]] = {}


def slurm_job_alive(pool: PoolDir, job_id: str) -> bool:
    """Asked of the scheduler at most every 2 s per job (a poll loop must not hammer squeue)."""
    if not job_id:
        return False
    seen = _SLURM_SEEN.get(job_id)
    if seen and time.monotonic() - seen[0] < 2.0:
        return seen[1]
    from workbench.launch.executors import SlurmJob  # sacct's failures without submitit's warnings

    try:
        alive = not SlurmJob(folder=pool.logs, job_id=job_id).done()
    except Exception:  # noqa: BLE001 - the scheduler does not answer: assume it may be alive
        alive = True
    _SLURM_SEEN[job_id] = (time.monotonic(), alive)
    return alive
