"""What the dashboard shows, as plain Python: computed from a Run, mapped onto widgets elsewhere.

`workbench.stream.RankFrames` reads each rank's metrics file incrementally (only the bytes appended
since the last poll) and keeps one DataFrame per rank, so a poll of a long run costs the new
records, not the whole history.  `dashboard_state` is a pure function of the run's status, those
frames and the failure; `read_state` does the reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.launch.status import RunStatus
from workbench.stream import RankFrames

if TYPE_CHECKING:
    from workbench.launch.run import RankFailure, Run

BADGE_COLOURS = {
    "pending": "#9e9e9e", "starting": "#5bc0de", "running": "#337ab7", "finished": "#5cb85c",
    "failed": "#d9534f", "aborted": "#f0ad4e", "interrupted": "#f0ad4e", "lost": "#8e44ad",
}
RATE_WINDOW = 20  # logged steps used for the step rate behind the ETA


@dataclass
class Badge:
    rank: int
    state: str
    step: int
    heartbeat_age_s: float | None
    silent: bool
    colour: str
    stalled: bool = False


@dataclass
class DashboardState:
    state: str
    """The run's state: pending, running, finished, failed, cancelled."""
    done: bool
    """The run reached a final state and its job ended: nothing will change any more."""
    step: int
    total_steps: int | None
    progress: float | None
    """Fraction of total_steps done (None while the total is unknown)."""
    eta_s: float | None
    steps_per_s: float | None
    badges: list[Badge] = field(default_factory=list)
    failure: str = ""
    """The failing rank, its exception and traceback ("" unless the run failed)."""
    failed_rank: int | None = None
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Metrics of every rank, at most max_points rows per rank (evenly spaced, last row kept)."""
    records: int = 0
    """Metric records read so far (every rank)."""
    health: dict[str, Any] = field(default_factory=dict)
    """Run.health(): in sync, stragglers, stalled ranks, warnings."""
    stacks: dict[int, str] = field(default_factory=dict)
    """Stack dumps of stalled ranks (rank -> text)."""


# --- the state -------------------------------------------------------------------------------------
def dashboard_state(status: RunStatus, frames: dict[int, pd.DataFrame], failure: RankFailure | None = None,
                    job_done: bool = True, frame: pd.DataFrame | None = None, records: int = 0) -> DashboardState:
    """Pure: what to show, from the run's status, its per-rank metrics and its first failure."""
    step = max(status.step, _logged_step(frames))
    total = status.total_steps
    if status.state == "finished" and total:
        step = max(step, total)
    progress = min(1.0, step / total) if total else None
    rate = step_rate(frames)
    eta = max(0.0, (total - step) / rate) if total and rate else None
    badges = [Badge(r.rank, r.state, r.step, r.heartbeat_age_s, r.silent, BADGE_COLOURS.get(r.state, "#777"),
                    r.stalled) for r in status.ranks]
    return DashboardState(
        status.state, status.done and job_done, step, total, progress, 0.0 if status.done else eta, rate,
        badges, failure_text(failure) if status.state == "failed" else "",
        failure.rank if failure is not None and status.state == "failed" else None,
        frame if frame is not None else pd.DataFrame(), records)


def _logged_step(frames: dict[int, pd.DataFrame]) -> int:
    """The step every rank has logged (the slowest rank's last step)."""
    lasts = [int(f["step"].iloc[-1]) for f in frames.values() if len(f) and "step" in f]
    return min(lasts) if lasts else 0


def step_rate(frames: dict[int, pd.DataFrame], window: int = RATE_WINDOW) -> float | None:
    """Optimizer steps per second over the last `window` logged steps of the slowest rank."""
    timed = [f for f in frames.values() if len(f) >= 2 and {"step", "time"} <= set(f.columns)]
    if not timed:
        return None
    slowest = min(timed, key=lambda f: f["step"].iloc[-1])
    tail = slowest.iloc[-window:]
    steps = float(tail["step"].iloc[-1] - tail["step"].iloc[0])
    seconds = float(tail["time"].iloc[-1] - tail["time"].iloc[0])
    return steps / seconds if steps > 0 and seconds > 0 else None


def failure_text(failure: RankFailure | None) -> str:
    if failure is None:
        return "the run failed without a rank error (the job ended early; see the logs)"
    return f"{failure}\n\n{failure.traceback.rstrip()}"


def read_state(run: Run, cache: RankFrames, max_points: int) -> DashboardState:
    """Poll the run's files once and compute the state."""
    status = run.status()  # first: once it says done, every record is on disk before the poll
    cache.poll()
    failure = run.exception(status) if status.state == "failed" else None
    state = dashboard_state(status, cache.frames, failure, run.job_done(), cache.frame(max_points), cache.records)
    state.health = run.health(status)  # the status just read: no second pass over the files
    state.stacks = run.stacks() if state.health["stalled_ranks"] else {}
    return state


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "ETA unknown"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"ETA {hours}:{rest // 60:02d}:{rest % 60:02d}"
