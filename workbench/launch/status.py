"""The state of a run and of each rank: the one place that derives them, from the run folder (status
files, the ranks' logged steps, events) plus the scheduler's word.  The Run handle, the CLI, the
dashboard and the report all show this object, so they cannot disagree."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.config.sections import DistConfig
from workbench.runfolder.layout import RunDir
from workbench.runfolder.rankstate import ACTIVE, liveness

if TYPE_CHECKING:
    import pandas as pd

TERMINAL = ("finished", "failed", "cancelled", "pruned")
"""A run's states once it ended: the one list (RunStatus.done, Run.wait, the runs table's kept rows).
"pruned" is a cancel by a sweep's pruner (run.json's `pruned` mark, written by the sweep's driver)."""
RATE_WINDOW_S = 30.0
"""The step rate (and so the ETA) is measured over this much of the latest logged time."""
RATE_MIN_RECORDS = 6
"""...and over at least this many of a rank's latest records (when it has them): two records alone
give a rate that swings with the logging interval."""
Columns = Mapping[str, Any]
"""A rank's logged metrics as far as the status reads them: "step" and "time" columns (a DataFrame,
or numpy arrays from RankFrames.columns, which makes no DataFrame)."""


@dataclass
class RankStatus:
    rank: int
    state: str
    """One of workbench.runfolder.rankstate.RANK_STATES (pending, starting, running, finished, failed,
    aborted, interrupted, requeued, lost)."""
    step: int = 0
    """The last step this rank finished: its heartbeat's or its last logged record's, the later."""
    heartbeat_age_s: float | None = None
    host: str = ""
    pid: int | None = None
    attempt: int = 0
    silent: bool = False
    """Active but no heartbeat for a while (workbench.runfolder.rankstate.liveness): frozen, or its node is slow."""
    stalled: bool = False
    """Heartbeat alive but no step finished for dist.stall_after_s; its stacks are in stacks/."""
    in_sync: bool | None = None
    """Parameters matched every other rank at the last check (None: not checked yet)."""
    output_lines: int = 0
    """Lines the rank printed (counted in script and function runs)."""
    stalled_s: float | None = None
    """While stalled: seconds since its last progress (a step, a printed line, CPU work), as of now."""
    where: str = ""
    """While stalled: where its main thread is, its innermost frame of the user's code
    ("train.py:42 in loss_fn"), as its heartbeat found it ("" when not known)."""
    waiting: bool = False
    """While stalled: its main thread waits in a collective (for a peer), not in the user's own code."""
    collective: str = ""
    """While stalled: the collective it entered last and that has not completed, by the flight recorder
    ("all_reduce #19"; "" when none or not recorded)."""


@dataclass
class RunStatus:
    state: str
    """pending, running, restarting (after a failure, launch.max_restarts), finished, failed, cancelled,
    pruned (cancelled by a sweep's pruner: a losing trial, not a failure)."""
    ranks: list[RankStatus] = field(default_factory=list)
    step: int = 0
    """The step every rank has reached (the slowest rank's step)."""
    total_steps: int | None = None
    job_state: str = ""
    steps_per_s: float | None = None
    """Steps per second over the latest RATE_WINDOW_S of logged time (the median of the ranks' rates:
    DDP ranks move in step, and one rank's hiccup does not swing it)."""
    records: int = 0
    """Metric records the ranks logged so far."""
    scheduler_error: str = ""
    """Set by Run.live_status while SLURM cannot be asked about the job: one line naming the job and
    carrying SLURM's own message.  The state is then the run folder's alone (the run may still be running)."""

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

    def progress_line(self) -> str:
        """"running · step 363/1000 (36%) · 12.3 steps/s · ETA 0:00:52": the one line the dashboard,
        `workbench show` and `workbench run` print, from this one object.  While ranks are stalled or
        silent it is stall_line() instead: a rate and an ETA would be the ones from before the stall."""
        stall = self.stall_line()
        if stall:
            return stall
        parts = [self.state, self._where_in_run()]
        if self.steps_per_s:
            parts.append(f"{self.steps_per_s:.3g} steps/s")
        if not self.done:
            parts.append(format_eta(self.eta_s))
        return " · ".join(parts)

    def _where_in_run(self) -> str:
        """"step 363/1000 (36%)"; "no step logged" for a script that logs none (it has no total)."""
        if not self.step and not self.total_steps:
            return "no step logged"
        text = f"step {self.step}" + (f"/{self.total_steps}" if self.total_steps else "")
        return text + (f" ({self.progress:.0%})" if self.progress is not None else "")

    @property
    def stalled(self) -> bool:
        """A running run that makes no progress: a rank stalled (dist.stall_after_s) or silent (no heartbeat)."""
        return self.state == "running" and any(r.stalled or r.silent for r in self.ranks)

    def stall_line(self) -> str:
        """Why a running run makes no progress, in one line ("" when it does):
        "stalled 45 s at step 9/32000 (0%): rank 1 at train.py:42 in loss_fn; rank 0 waits in a collective".
        The ranks named are those that hold the others up: stuck outside a collective, or silent (no
        heartbeat: stopped or hung); when every stalled rank waits in a collective, all of them.
        The seconds are the longest any of them has made no progress (a silent rank: since its last beat)."""
        if not self.stalled:
            return ""
        stalled = [r for r in self.ranks if r.stalled]
        holding = [r for r in self.ranks if r.silent or (r.stalled and not r.waiting)] or stalled
        silent = [r.heartbeat_age_s or 0.0 for r in self.ranks if r.silent]
        seconds = max([r.stalled_s or 0.0 for r in stalled] + silent)
        parts = [_held_up_by(r) for r in holding]
        waiting = [r.rank for r in stalled if r.waiting and r not in holding]
        if waiting:
            who = f"rank {waiting[0]} waits" if len(waiting) == 1 else f"ranks {_listed(waiting)} wait"
            named = {r.collective for r in stalled if r.rank in waiting}
            parts.append(f"{who} in {named.pop() if len(named) == 1 and '' not in named else 'a collective'}")
        return f"stalled {seconds:.0f} s at {self._where_in_run()}: " + "; ".join(parts)

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.ranks])

    def __str__(self) -> str:
        if self.records == 0 and self.state != "pending":  # a script or function that logs no metric
            lines = sum(r.output_lines for r in self.ranks)
            ranks = ", ".join(f"{r.rank}:{r.state}" for r in self.ranks)
            return f"{self.state} (no metrics logged; {lines} lines of output; ranks {ranks})"
        ranks = ", ".join(f"{r.rank}:{r.state}@{r.step}" for r in self.ranks)
        total = f"/{self.total_steps}" if self.total_steps else ""
        return f"{self.state} (step {self.step}{total}; ranks {ranks})"


def _held_up_by(rank: RankStatus) -> str:
    """One stalled or silent rank in the stall line: "rank 1 at train.py:42 in loss_fn"."""
    if rank.silent:
        return (f"rank {rank.rank} not answering (no heartbeat for {rank.heartbeat_age_s or 0:.0f} s: "
                "stopped or hung)")
    at = f" at {rank.where}" if rank.where else ""
    return f"rank {rank.rank}" + (f" waiting in {rank.collective or 'a collective'}{at}" if rank.waiting else at)


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def run_status(run: RunDir, world_size: int, job_done: bool, cancelled: float | bool | None,
               frames: Mapping[int, Columns], total_steps: int | None = None, job_state: str = "",
               now: float | None = None, lost_after_s: float = DistConfig.lost_after_s,
               pruned: bool = False) -> RunStatus:
    """Everything about where a run stands.  `frames` are the ranks' logged metrics, read after
    the status files (so a rank's final records are in them once its status says it ended);
    `lost_after_s` is the run's dist.lost_after_s; `pruned`: the cancel was a sweep's pruner's
    (pruned_mark of its run.json)."""
    logged = last_steps(frames)
    ranks = rank_statuses(run, world_size, job_done, logged, now, lost_after_s)
    state = overall_state(run, ranks, job_done, cancelled, pruned)
    step = slowest_step(state, ranks, logged)
    records = sum(len(np.asarray(f["step"])) for f in frames.values() if "step" in f)
    return RunStatus(state, ranks, step, total_steps, job_state, step_rate(frames), records)


def slowest_step(state: str, ranks: Sequence[RankStatus], logged: Mapping[int, int]) -> int:
    """The run's step: its slowest rank's.  Once the run ended, that of the ranks that logged a step
    (`logged`: rank -> its last): a script may log on rank 0 alone, and its rank 1 stays at 0."""
    counted = [r for r in ranks if r.rank in logged] if state in TERMINAL and logged else ranks
    return min((r.step for r in counted), default=0)


def rank_statuses(run: RunDir, world_size: int, job_done: bool, logged: dict[int, int] | None = None,
                  now: float | None = None, lost_after_s: float = DistConfig.lost_after_s) -> list[RankStatus]:
    now = now or time.time()
    logged = logged or {}
    out = []
    for rank in range(world_size):
        data = run.read_status(rank)  # state and time are there, every field has its type
        if data is None:
            out.append(RankStatus(rank, "pending", logged.get(rank, 0)))
            continue
        age = now - data["time"]
        state = data["state"]
        live = liveness(state, age, lost_after_s)
        if (state in ACTIVE and (job_done or live == "lost")) or state in ("aborted", "interrupted"):
            state = ended_unsaid(run, rank, state, data)
        step = max(data.get("step", 0), logged.get(rank, 0))
        stalled = bool(data.get("stalled")) and state == "running"
        out.append(RankStatus(rank, state, step, round(age, 2), data.get("host", ""), data.get("pid"),
                              data.get("attempt", 0), live == "silent", stalled, data.get("in_sync"),
                              data.get("output_lines", 0), *(_stall(data, now) if stalled else (None, "", False, ""))))
    return out


def ended_unsaid(run: RunDir, rank: int, state: str, data: Mapping[str, Any]) -> str:
    """How a rank reads that did not say how it ended (still "starting"/"running" when its job ended
    or its heartbeat stopped), or that was stopped from outside ("aborted" for a peer's failure,
    "interrupted" by a signal): "hung" when it was named hung, that being what held the others up,
    whatever stopped it then: its error record of this attempt says Hung (dist.on_hang: fail), or
    its status says it was named (dist.on_hang: warn) and was still stalled when it was stopped.
    Else a rank that said nothing is "lost" (killed, out of memory, stopped or frozen past
    lost_after_s), and an aborted or interrupted one stays so."""
    error = run.read_error(rank)
    attempt = data.get("attempt", 0)
    if isinstance(error, dict) and error.get("attempt", attempt) == attempt:
        hung = error.get("type") == "Hung"
    else:
        hung = data.get("hung") is True and (state in ACTIVE or data.get("stalled") is True)
    return "hung" if hung else ("lost" if state in ACTIVE else state)


def _stall(data: Mapping[str, Any], now: float) -> tuple[float | None, str, bool, str]:
    """(seconds since its last progress, where it is stuck, waiting in a collective, which one) of a
    stalled rank, from its status: `stalled_since` (else the hang watch's `stuck_s` at the beat), `where`,
    `waiting`, and the flight recorder's latest entry while it has not completed."""
    if "stalled_since" in data:
        seconds: float | None = max(0.0, now - float(data["stalled_since"]))
    elif "stuck_s" in data:
        seconds = float(data["stuck_s"]) + max(0.0, now - float(data["time"]))
    else:
        seconds = None
    open_ = data.get("collective") and data.get("collective_done") is False
    which = f"{data['collective']} #{data.get('collective_seq')}" if open_ else ""
    return (round(seconds, 1) if seconds is not None else None, str(data.get("where") or ""),
            data.get("waiting") is True, which)


def pruned_mark(meta: Mapping[str, Any]) -> bool:
    """Whether a sweep's pruner stopped the run: run.json's `pruned` record (step, value, why),
    written by the sweep's driver before it cancels the trial's run."""
    return isinstance(meta.get("pruned"), dict)


def overall_state(run: RunDir, ranks: list[RankStatus], job_done: bool, cancelled: float | bool | None,
                  pruned: bool = False) -> str:
    """pending, running, restarting, finished, failed, cancelled or pruned (a cancel by a sweep's
    pruner).  A cancel that came after a rank failed does not hide the failure; failures that
    followed the cancel (ranks stopping) are moot."""
    errors = [e for e in (run.read_error(r) for r in run.rank_files("errors")) if isinstance(e, dict)]
    if not errors and run.read_summary():  # every rank trained to the end together
        return "finished"
    if cancelled:
        failed_first = any(float(e.get("time") or 0) < float(cancelled) for e in errors)
        if job_done and not failed_first:
            return "pruned" if pruned else "cancelled"
    if not job_done and any(r.state == "restarting" for r in ranks):
        return "restarting"
    if errors or any(r.state == "failed" for r in ranks):
        return "failed"
    if run.read_summary():  # every rank trained to the end together; a late "lost" is moot
        return "finished"
    if any(r.state in ("lost", "hung") for r in ranks):  # gone without a word, or named hung and then gone
        return "failed"
    if job_done:
        return "finished" if ranks and all(r.state == "finished" for r in ranks) else "failed"
    if any(r.state != "pending" for r in ranks):
        return "running"
    return "pending"


def last_steps(frames: Mapping[int, Columns]) -> dict[int, int]:
    """rank -> the last step it logged."""
    steps = {rank: np.asarray(f["step"]) for rank, f in frames.items() if "step" in f}
    return {rank: int(values[-1]) for rank, values in steps.items() if len(values)}


def step_rate(frames: Mapping[int, Columns], window_s: float = RATE_WINDOW_S) -> float | None:
    """Optimizer steps per second over the ranks' latest `window_s` of logged time (at least their
    last RATE_MIN_RECORDS records): the median of the ranks' rates.

    A time window (not a poll interval) keeps the rate steady whatever the logging interval and
    however often it is asked for; it is computed from the files, so every viewer agrees."""
    import statistics

    rates = [r for r in map(lambda f: _rank_rate(f, window_s), frames.values()) if r is not None]
    return statistics.median(rates) if rates else None


def _rank_rate(frame: Columns, window_s: float) -> float | None:
    if "step" not in frame or "time" not in frame:
        return None
    times, all_steps = np.asarray(frame["time"], dtype=float), np.asarray(frame["step"])
    if not np.isfinite(times).all():  # a step whose records carried no time (merged rows keep the others')
        logged = np.isfinite(times)
        times, all_steps = times[logged], all_steps[logged]
    if len(times) < 2:
        return None
    if times[-1] >= times[0]:  # in time order (as written): find the window's start by bisection
        first = int(np.searchsorted(times, times[-1] - window_s, side="left"))
    else:
        first = int((times < times[-1] - window_s).sum())
    first = min(first, max(0, len(times) - RATE_MIN_RECORDS))
    steps = float(all_steps[-1] - all_steps[first])
    seconds = float(times[-1] - times[first])
    return steps / seconds if steps > 0 and seconds > 0 else None


def format_eta(seconds: float | None) -> str:
    """"ETA 1:02:03" ("ETA unknown" while there is no rate yet)."""
    if seconds is None or not math.isfinite(seconds):
        return "ETA unknown"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"ETA {hours}:{rest // 60:02d}:{rest % 60:02d}"
