"""The state of a run and of each rank, derived from the run folder plus the scheduler's word."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from workbench.rundir import RunDir, read_json

if TYPE_CHECKING:
    import pandas as pd

SILENT_AFTER_S = 30.0
TERMINAL = ("finished", "failed", "cancelled")


@dataclass
class RankStatus:
    rank: int
    state: str
    """pending, starting, running, finished, failed, aborted (stopped because a peer failed), interrupted, lost."""
    step: int = 0
    heartbeat_age_s: float | None = None
    host: str = ""
    pid: int | None = None
    attempt: int = 0
    silent: bool = False
    """Running, but no heartbeat for SILENT_AFTER_S: the process is frozen or its node is gone."""
    stalled: bool = False
    """Heartbeat alive but no step finished for dist.stall_after_s; its stacks are in stacks/."""
    in_sync: bool | None = None
    """Parameters matched every other rank at the last check (None: not checked yet)."""


@dataclass
class RunStatus:
    state: str
    """pending, running, finished, failed, cancelled."""
    ranks: list[RankStatus] = field(default_factory=list)
    step: int = 0
    total_steps: int | None = None
    job_state: str = ""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.ranks])

    def __str__(self) -> str:
        ranks = ", ".join(f"{r.rank}:{r.state}@{r.step}" for r in self.ranks)
        total = f"/{self.total_steps}" if self.total_steps else ""
        return f"{self.state} (step {self.step}{total}; ranks {ranks})"


def rank_statuses(run: RunDir, world_size: int, job_done: bool, now: float | None = None) -> list[RankStatus]:
    now = now or time.time()
    out = []
    for rank in range(world_size):
        data = read_json(run.status(rank))
        if not data:
            out.append(RankStatus(rank, "pending"))
            continue
        age = now - float(data.get("time", now))
        state = data.get("state", "running")
        if job_done and state in ("starting", "running"):
            state = "lost"  # the job ended but this rank never said so: killed, or out of memory
        silent = state == "running" and age > SILENT_AFTER_S
        out.append(RankStatus(rank, state, int(data.get("step", 0)), round(age, 2), data.get("host", ""),
                              data.get("pid"), int(data.get("attempt", 0)), silent,
                              bool(data.get("stalled")) and state == "running", data.get("in_sync")))
    return out


def overall_state(run: RunDir, ranks: list[RankStatus], job_done: bool, cancelled: bool) -> str:
    if cancelled and job_done:
        return "cancelled"
    if run.ranks_with("errors") or any(r.state == "failed" for r in ranks):
        return "failed"
    if read_json(run.summary):  # every rank trained to the end together; a late "lost" is moot
        return "finished"
    if any(r.state == "lost" for r in ranks):
        return "failed"
    if job_done:
        return "finished" if ranks and all(r.state == "finished" for r in ranks) else "failed"
    if any(r.state not in ("pending",) for r in ranks):
        return "running"
    return "pending"


def total_steps(events: list[dict]) -> int | None:
    """The planned number of steps, from rank 0's latest start event (a resume may change it)."""
    starts = [r for r in events if r.get("event") == "start" and r.get("rank") == 0 and "total_steps" in r]
    return starts[-1]["total_steps"] if starts else None


