"""What the dashboard shows, as plain Python: computed from a Run, mapped onto widgets elsewhere.

Every number comes from the Run handle: `Run.status()` (run and rank states, the step every rank
has reached, progress, rate and ETA: workbench.launch.status), its one metrics reader
(`Run.metric_frames`, which reads only what was appended since the last poll) and `Run.health()`.
`dashboard_state` is a pure function of those; `read_state` does the reading.

One clock: a refresh polls the metrics once (inside `Run.status()`), and the status line, the badges,
the progress line, the curves and the range line all show that one snapshot.  A rank's step is the
last step it logged in the snapshot (its heartbeat may run a few steps ahead of its records), so the
curves end where the badges and the progress line say.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.launch.status import RunStatus, format_eta, slowest_step  # noqa: F401 - format_eta: re-exported
from workbench.results.series import MetricData

if TYPE_CHECKING:
    from workbench.launch.run import RankFailure, Run

BADGE_COLOURS = {
    "pending": "#757575", "starting": "#0277bd", "running": "#1565c0", "finished": "#2e7d32",
    "failed": "#c62828", "aborted": "#ad5700", "interrupted": "#ad5700", "requeued": "#6a1b9a",
    "lost": "#4a148c", "hung": "#4a148c", "restarting": "#6a1b9a",
}
"""A colour for every state in workbench.runfolder.rankstate.RANK_STATES (white text on each reads at >= 4.5:1)."""


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
    """The run's state (RunStatus.state): pending, running, restarting, finished, failed, cancelled, pruned."""
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
    data: MetricData = field(default_factory=lambda: MetricData({}))
    """Every rank's metrics in this snapshot (all rows; drawing reduces them per pixel column)."""
    records: int = 0
    """Metric records read so far (every rank)."""
    health: dict[str, Any] = field(default_factory=dict)
    """Run.health(): in sync, stragglers, stalled ranks, warnings."""
    stacks: dict[int, str] = field(default_factory=dict)
    """Stack dumps of stalled ranks (rank -> text)."""
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The validation results so far (Run.evals())."""
    line: str = ""
    """RunStatus.progress_line(): state, step, progress, rate, ETA, as `workbench show` prints them
    (while the run is stalled, its stall line)."""
    stall: str = ""
    """RunStatus.stall_line(): why a running run makes no progress ("" while it does)."""
    earlier_failures: list[str] = field(default_factory=list)
    """Failures of attempts that were restarted (launch.max_restarts), each with its traceback's end."""
    scheduler_error: str = ""
    """RunStatus.scheduler_error: why SLURM could not be asked about the job, in one line ("" when it answered)."""

    @property
    def frame(self) -> pd.DataFrame:
        """The snapshot's metrics as one DataFrame (one row per rank and step, sorted by step, rank)."""
        parts = [pd.DataFrame(cols) for _, cols in sorted(self.data.ranks.items())]
        if not parts:
            return pd.DataFrame()
        return pd.concat(parts, ignore_index=True).sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


# --- the state -------------------------------------------------------------------------------------
def dashboard_state(status: RunStatus, failure: RankFailure | None = None, job_done: bool = True,
                    data: MetricData | None = None) -> DashboardState:
    """Pure: what to show, from the run's status (steps, rate, ranks), its first failure and the
    metrics of the same snapshot (whose last logged steps are the ranks' steps)."""
    if data is not None:
        status = on_data_clock(status, data)
    badges = [Badge(r.rank, r.state, r.step, r.heartbeat_age_s, r.silent, BADGE_COLOURS.get(r.state, "#555"),
                    r.stalled) for r in status.ranks]
    failed = status.state == "failed"
    return DashboardState(
        status.state, status.done and job_done, status.step, status.total_steps, status.progress, status.eta_s,
        status.steps_per_s, badges, failure_text(failure) if failed else "",
        failure.rank if failure is not None and failed else None,
        data if data is not None else MetricData({}), status.records, line=status.progress_line(),
        stall=status.stall_line(), scheduler_error=status.scheduler_error)


def on_data_clock(status: RunStatus, data: MetricData) -> RunStatus:
    """The status with each rank's step the last one it logged in `data` (ranks that logged nothing
    keep their heartbeat's step), and the run's step the slowest rank's: the progress line, the
    badges and the curves then tell the same time."""
    logged = data.last_steps()
    if not logged:
        return status
    ranks = [dataclasses.replace(r, step=logged.get(r.rank, r.step)) for r in status.ranks]
    return dataclasses.replace(status, ranks=ranks, step=slowest_step(status.state, ranks, logged) if ranks
                               else status.step)


def failure_text(failure: RankFailure | None) -> str:
    if failure is None:
        return "the run failed without a rank error (the job ended early; see the logs)"
    return f"{failure.summary()}\n\n{failure.traceback.rstrip()}"  # the cause, what followed, its traceback


def read_state(run: Run, max_points: int | None = None) -> DashboardState:
    """Poll the run's files once (through the Run's own readers) and compute the state.  (max_points
    is no longer used: every logged point is kept, and drawing reduces them per pixel column.)"""
    with run.reading:  # no other poll of this handle (a second dashboard, Run.wait) between these reads
        status, job_done = run.live_status()  # the one poll of the metrics in this refresh; never raises for SLURM
        evals = run.evals()
        data = MetricData.from_run(run, evals)  # what that poll read: no second poll
    return state_of(run, status, job_done, evals, data)


def state_of(run: Run, status: RunStatus, job_done: bool, evals: pd.DataFrame, data: MetricData) -> DashboardState:
    """The state of one snapshot (the status and the metrics it read), with what else the dashboard shows."""
    failure = run.exception(status) if status.state == "failed" else None
    state = dashboard_state(status, failure, job_done, data)
    state.evals = evals
    state.health = run.health(status)  # the status just read: no second pass over the files
    state.stacks = run.stacks() if state.health["stalled_ranks"] else {}
    # restarted attempts' failures (Run.failures() reads the run again: only when there are some)
    state.earlier_failures = earlier_failures(run.failures(status), failure) if run.dir.archived_errors() else []
    return state


def earlier_failures(failures: list[RankFailure], current: RankFailure | None) -> list[str]:
    """Each failure on record but the current one: "attempt A: rank R raised T: message" and the
    last lines of its traceback."""
    shown = []
    for f in failures:
        if current is not None and (f.rank, f.attempt) == (current.rank, current.attempt):
            continue
        tail = "\n".join(f.traceback.rstrip().splitlines()[-8:])
        shown.append(f"attempt {f.attempt}: {f}" + (f"\n{tail}" if tail else ""))
    return shown
