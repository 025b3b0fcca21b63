"""The state of a run and of each rank: the one place that derives them, from the run folder (status
files, the ranks' logged steps, events) plus the scheduler's word.  The Run handle, the CLI, the
dashboard and the report all show this object, so they cannot disagree."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from workbench.rankstate import ACTIVE, liveness
from workbench.rundir import RunDir, read_json

if TYPE_CHECKING:
    import pandas as pd

TERMINAL = ("finished", "failed", "cancelled")
RATE_WINDOW_S = 30.0
"""The step rate (and so the ETA) is measured over this much of the latest logged time."""


@dataclass
class RankStatus:
    rank: int
    state: str
    """One of workbench.rankstate.RANK_STATES (pending, starting, running, finished, failed,
    aborted, interrupted, requeued, lost)."""
    step: int = 0
    """The last step this rank finished: its heartbeat's or its last logged record's, the later."""
    heartbeat_age_s: float | None = None
    host: str = ""
    pid: int | None = None
    attempt: int = 0
    silent: bool = False
    """Active but no heartbeat for rankstate.SILENT_AFTER_S: frozen, or its node is slow to answer."""
    stalled: bool = False
    """Heartbeat alive but no step finished for dist.stall_after_s; its stacks are in stacks/."""
    in_sync: bool | None = None
    """Parameters matched every other rank at the last check (None: not checked yet)."""


@dataclass
class RunStatus:
    state: str
    """pending, running, restarting (after a failure, launch.max_restarts), finished, failed, cancelled."""
    ranks: list[RankStatus] = field(default_factory=list)
    step: int = 0
    """The step every rank has reached (the slowest rank's step)."""
    total_steps: int | None = None
    job_state: str = ""
    steps_per_s: float | None = None
    """Steps per second of the slowest rank over the latest RATE_WINDOW_S of logged time."""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def progress(self) -> float | None:
        """Fraction of total_steps done (1 once finished, also after an early stop; None if unknown)."""
        if self.state == "finished":
            return 1.0
        return min(1.0, self.step / self.total_steps) if self.total_steps else None

    @property
    def eta_s(self) -> float | None:
        if self.done:
            return 0.0
        if not self.total_steps or not self.steps_per_s:
            return None
        return max(0.0, (self.total_steps - self.step) / self.steps_per_s)

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.ranks])

    def __str__(self) -> str:
        ranks = ", ".join(f"{r.rank}:{r.state}@{r.step}" for r in self.ranks)
        total = f"/{self.total_steps}" if self.total_steps else ""
        return f"{self.state} (step {self.step}{total}; ranks {ranks})"


def run_status(run: RunDir, world_size: int, job_done: bool, cancelled: float | bool | None,
               frames: dict[int, pd.DataFrame], total_steps: int | None = None, job_state: str = "",
               now: float | None = None) -> RunStatus:
    """Everything about where a run stands.  `frames` are the ranks' logged metrics, read after
    the status files (so a rank's final records are in them once its status says it ended)."""
    ranks = rank_statuses(run, world_size, job_done, last_steps(frames), now)
    state = overall_state(run, ranks, job_done, cancelled)
    step = min((r.step for r in ranks), default=0)
    return RunStatus(state, ranks, step, total_steps, job_state, step_rate(frames))


def rank_statuses(run: RunDir, world_size: int, job_done: bool, logged: dict[int, int] | None = None,
                  now: float | None = None) -> list[RankStatus]:
    now = now or time.time()
    logged = logged or {}
    out = []
    for rank in range(world_size):
        data = read_json(run.status(rank))
        if not isinstance(data, dict):
            out.append(RankStatus(rank, "pending", logged.get(rank, 0)))
            continue
        age = now - float(data.get("time", now))
        state = data.get("state", "running")
        live = liveness(state, age)
        if state in ACTIVE and (job_done or live == "lost"):
            state = "lost"  # never said how it ended: killed, out of memory, or frozen past LOST_AFTER_S
        step = max(int(data.get("step", 0)), logged.get(rank, 0))
        out.append(RankStatus(rank, state, step, round(age, 2), data.get("host", ""), data.get("pid"),
                              int(data.get("attempt", 0)), live == "silent",
                              bool(data.get("stalled")) and state == "running", data.get("in_sync")))
    return out


def overall_state(run: RunDir, ranks: list[RankStatus], job_done: bool, cancelled: float | bool | None) -> str:
    """pending, running, restarting, finished, failed or cancelled.  A cancel that came after a rank
    failed does not hide the failure; failures that followed the cancel (ranks stopping) are moot."""
    errors = [e for e in map(read_json, run.rank_files("errors").values()) if isinstance(e, dict)]
    if not errors and read_json(run.summary):  # every rank trained to the end together
        return "finished"
    if cancelled:
        failed_first = any(float(e.get("time") or 0) < float(cancelled) for e in errors)
        if job_done and not failed_first:
            return "cancelled"
    if not job_done and any(r.state == "restarting" for r in ranks):
        return "restarting"
    if errors or any(r.state == "failed" for r in ranks):
        return "failed"
    if read_json(run.summary):  # every rank trained to the end together; a late "lost" is moot
        return "finished"
    if any(r.state == "lost" for r in ranks):
        return "failed"
    if job_done:
        return "finished" if ranks and all(r.state == "finished" for r in ranks) else "failed"
    if any(r.state != "pending" for r in ranks):
        return "running"
    return "pending"


def last_steps(frames: dict[int, pd.DataFrame]) -> dict[int, int]:
    """rank -> the last step it logged."""
    return {rank: int(f["step"].iloc[-1]) for rank, f in frames.items() if len(f) and "step" in f}


def step_rate(frames: dict[int, pd.DataFrame], window_s: float = RATE_WINDOW_S) -> float | None:
    """Optimizer steps per second of the slowest rank over its latest `window_s` of logged time.

    A time window (not a number of records) keeps the rate steady whatever the logging interval
    and however often it is asked for; it is computed from the files, so every viewer agrees."""
    timed = [f for f in frames.values() if len(f) >= 2 and {"step", "time"} <= set(f.columns)]
    if not timed:
        return None
    slowest = min(timed, key=lambda f: f["step"].iloc[-1])
    times = slowest["time"].astype(float)
    recent = slowest[times >= float(times.iloc[-1]) - window_s]
    if len(recent) < 2:
        recent = slowest.iloc[-2:]
    steps = float(recent["step"].iloc[-1] - recent["step"].iloc[0])
    seconds = float(recent["time"].iloc[-1] - recent["time"].iloc[0])
    return steps / seconds if steps > 0 and seconds > 0 else None
