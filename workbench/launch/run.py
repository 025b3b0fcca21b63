"""The Run handle: a live view of a submitted job through its run folder and its submitit job."""

from __future__ import annotations

import functools
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config import JobConfig
from workbench.failures import last_traceback
from workbench.launch.status import RunStatus, run_status
from workbench.proctree import Proc, end
from workbench.rankstate import LOST_AFTER_S, lost_message
from workbench.rundir import RunDir, read_json
from workbench.runevents import EventSummary
from workbench.stream import MultiTail, RankFrames

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

STOP_GRACE_S = 30.0
"""After a rank failed, its agents end the attempt within seconds; this handle ends the job itself
(controller, agents, workers) only if something is still there after this long."""


class RunFailed(RuntimeError):
    """The run failed; `failure` names the rank and carries its traceback."""

    def __init__(self, failure: RankFailure | None, run_dir: Path):
        self.failure = failure
        what = str(failure) if failure else "the job ended without a result"
        super().__init__(f"run {run_dir} failed: {what}")


@dataclass
class RankFailure:
    rank: int
    type: str
    message: str
    traceback: str
    host: str = ""
    attempt: int = 0
    """The attempt that failed (0, then 1, ... after each restart or requeue)."""
    time: float = 0.0

    def __str__(self) -> str:
        host = f" ({self.host})" if self.host else ""
        return f"rank {self.rank}{host} raised {self.type}: {self.message}"

    @classmethod
    def from_record(cls, error: dict[str, Any]) -> RankFailure:
        return cls(int(error.get("rank", -1)), str(error.get("type", "")), str(error.get("message", "")),
                   str(error.get("traceback", "")), str(error.get("host") or ""), int(error.get("attempt") or 0),
                   float(error.get("time") or 0.0))


class Run:
    """A submitted (or finished) run.  Cheap to poll: files are tailed by byte offset.

    The handle owns the one reader of the run's metrics and events; the CLI, the dashboard and the
    report all read through it, so each record is parsed once and every view shows the same."""

    def __init__(self, run_dir: str | Path, job: Any = None):
        self.dir = RunDir(Path(run_dir))
        self.job = job
        self.metric_frames = RankFrames(self.dir.folder("metrics"))
        """The one incremental reader of every rank's metrics (shared with the dashboard)."""
        self._events = MultiTail(self.dir.folder("events"))
        self._summary = EventSummary()
        self._stragglers: tuple[int, pd.DataFrame] | None = None
        self._failed_at: float | None = None

    @classmethod
    def load(cls, run_dir: str | Path) -> Run:
        """Reattach to a run folder (after a kernel restart): SLURM jobs are followed again."""
        run = RunDir(Path(run_dir))
        meta = read_json(run.meta)
        if meta is None:
            raise FileNotFoundError(f"{run_dir} is not a workbench run folder (no run.json)")
        return cls(run.root, _reattach_job(meta, run))

    @property
    def folder(self) -> Path:
        return self.dir.root

    @property
    def meta(self) -> dict[str, Any]:
        return read_json(self.dir.meta, {}) or {}

    @functools.cached_property
    def config(self) -> JobConfig:
        """The config snapshot in the run folder (read once per handle)."""
        return JobConfig.from_yaml(self.dir.config)

    @functools.cached_property
    def world_size(self) -> int:
        """Fixed for the life of a handle (read once from run.json, not on every poll)."""
        return int(self.meta.get("world_size", 1))

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r}, {self.status().state})"

    # --- state -----------------------------------------------------------------------------------
    def job_done(self) -> bool:
        if self.job is None:
            return True
        return bool(self.job.done())

    def status(self) -> RunStatus:
        """Where the run stands: run and rank states, steps, rate (workbench.launch.status)."""
        done = self.job_done()
        cancelled = self.meta.get("cancelled")
        self.metric_frames.poll()  # after job_done: once it says done, every record is on disk
        return run_status(self.dir, self.world_size, done, cancelled, self.metric_frames.frames,
                          self.event_summary().total_steps, _job_state(self.job))

    def event_summary(self) -> EventSummary:
        """The run's events folded once (incrementally): total steps, sync checks, warnings."""
        new = self._events.poll()
        return self._summary.fold(new)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5,
             on_poll: Callable[[Run], None] | None = None) -> RunStatus:
        """Block until the run is finished, failed or cancelled (or `timeout` seconds passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if on_poll is not None:
                on_poll(self)
            self._stop_survivors(status)
            if status.done and self.job_done():
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.folder} still {status.state} after {timeout} s: {status}")
            time.sleep(poll_s)

    def _stop_survivors(self, status: RunStatus) -> None:
        """A rank failed: its agents end the attempt; end the job here if it is still there later."""
        if status.state != "failed" or self.job_done():
            return
        self._failed_at = self._failed_at or time.monotonic()
        if time.monotonic() - self._failed_at > STOP_GRACE_S:
            self._stop_job()

    def cancel(self) -> None:
        """Stop every rank, from any handle (the submitting one, or Run.load after a kernel restart).
        Returns once they are gone (a local run: at most about STOP_GRACE_S).  The latest finished
        checkpoint and all logged metrics stay; the run is reported as cancelled."""
        if self.job_done() and self.status().done:
            return  # it ended already: a finished run stays finished
        self.dir.mark_cancelled("Run.cancel()")
        self._stop_job()

    def _stop_job(self) -> None:
        if isinstance(self.job, _LocalPid) or self.meta.get("executor") == "local":
            host = self.meta.get("submit_host")
            if host and host != socket.gethostname():
                raise RuntimeError(f"run {self.folder} runs on {host}: cancel it there (workbench cancel)")
            controller = _controller(self.meta) or (self.job.proc if isinstance(self.job, _LocalPid) else None)
            # The controller asks the agents, they end their workers; then whatever is left is killed.
            end([controller] if controller else [], STOP_GRACE_S)
            end(self.dir.recorded("agent") + self.dir.recorded("worker"), 1.0)
            if self.job is not None:
                self.job_done()  # reap our own child
        elif self.job is not None and not self.job_done():
            self.job.cancel()

    # --- results ---------------------------------------------------------------------------------
    def metrics(self, max_points: int | None = None) -> pd.DataFrame:
        """Every logged step of every rank (rank, step, loss, loss_reduced, lr, step_time_s, ...),
        read incrementally.  After a requeue, steps trained again keep the newest attempt's row."""
        self.metric_frames.poll()
        return self.metric_frames.frame(max_points)

    def events(self) -> pd.DataFrame:
        from workbench.stream import to_frame

        self.event_summary()
        return to_frame(self._events.records, ("time",))

    def logs(self, rank: int = 0, stream: str = "both", tail_bytes: int | None = None) -> str:
        """The rank's stdout and stderr (submitit's per-task log files)."""
        parts = []
        for suffix in ({"out": ["out"], "err": ["err"]}.get(stream, ["out", "err"])):
            for path in self.dir.log_files(rank, suffix):
                text = path.read_text(errors="replace")
                parts.append(text[-tail_bytes:] if tail_bytes else text)
        return "".join(parts)

    def result(self) -> dict[str, Any]:
        """The run summary; raises RunFailed (with the failing rank's traceback) if it failed."""
        status = self.status()
        if status.state == "failed":
            raise RunFailed(self.exception(), self.folder)
        summary = read_json(self.dir.summary)
        if summary is None:
            raise RuntimeError(f"run {self.folder} is {status.state}: no summary yet")
        return summary

    def exception(self, status: RunStatus | None = None) -> RankFailure | None:
        """The first failure of the latest attempt: the earliest rank error, or a rank that ended
        without a word (lost, dated by its last heartbeat), whichever came first; when no rank left
        a word at all, the last traceback in a rank's stderr (an error before the rank could report)."""
        errors = [e for e in map(read_json, self.dir.rank_files("errors").values()) if isinstance(e, dict)]
        failures = [(f.time, f) for f in map(RankFailure.from_record, errors)]
        reported = {f.rank for _, f in failures}
        status = status or self.status()
        for r in status.ranks:
            if r.state == "lost" and r.rank not in reported:
                age = r.heartbeat_age_s or 0.0
                silent = age if age > LOST_AFTER_S else None  # else the job ended soon after its last beat
                failure = RankFailure(r.rank, "Lost", lost_message(r.rank, silent), self.logs(r.rank, tail_bytes=4000),
                                      r.host, r.attempt)
                failures.append((time.time() - (r.heartbeat_age_s or 0.0), failure))
        if not failures and status.state == "failed":
            return self._failure_from_stderr()
        return min(failures, key=lambda item: item[0])[1] if failures else None

    def _failure_from_stderr(self) -> RankFailure | None:
        for rank in range(self.world_size):
            found = last_traceback(self.logs(rank, "err", tail_bytes=64_000))
            if found is not None:
                kind, message, text = found
                return RankFailure(rank, kind, message, text)
        return None

    def failures(self) -> list[RankFailure]:
        """The failure of each attempt on record, oldest first: each restarted attempt's
        (errors/failure-N/) and the current one's.  Per attempt the first error is the failure; the
        others' errors that followed it (a collective broken by it) stay in the files."""
        found = []
        for files in [*self.dir.archived_errors(), self.dir.rank_files("errors")]:
            records = [RankFailure.from_record(e) for e in map(read_json, files.values()) if isinstance(e, dict)]
            if records:
                found.append(min(records, key=lambda f: f.time))
        return found

    def health(self, status: RunStatus | None = None) -> dict[str, Any]:
        """What the ranks' own checks said (parameters in sync at the last check, data shards,
        warnings), the stragglers (the same verdict as the report's) and the stalled ranks."""
        found = self.event_summary().health()
        slow = self.stragglers()
        found["stragglers"] = dict(zip(slow["rank"].astype(int).tolist(), slow["slower_by"].astype(float).tolist()))
        found["stalled_ranks"] = [r.rank for r in (status or self.status()).ranks if r.stalled or r.silent]
        return found

    def stragglers(self) -> pd.DataFrame:
        """Ranks whose own work per step exceeds the others' median by more than
        dist.straggler_threshold (workbench.analysis.stragglers over every logged step): the one
        verdict the dashboard's health line, `workbench show` and the report give."""
        from workbench.analysis import stragglers

        self.metric_frames.poll()
        version = self.metric_frames.version
        if self._stragglers is None or self._stragglers[0] != version:
            found = stragglers(self.metric_frames.frame(), self.config.dist.straggler_threshold)
            self._stragglers = (version, found)
        return self._stragglers[1]

    def stacks(self) -> dict[int, str]:
        """Python stack dumps of ranks that stalled (rank -> text), written by the ranks themselves."""
        return {r: self.dir.stacks(r).read_text(errors="replace") for r in range(self.world_size)
                if self.dir.stacks(r).exists()}

    def plot(self, **kwargs: Any) -> Figure:
        """Loss per rank and reduced loss (matplotlib)."""
        from workbench.plots import plot_run

        return plot_run(self.metrics(), **kwargs)

    def dashboard(self, **kwargs: Any) -> Any:
        from workbench.ui.dashboard import Dashboard

        return Dashboard(self, **kwargs)

    def report(self) -> dict[str, Any]:
        """Step time split (data, compute, communication) per rank, stragglers, memory imbalance and
        what would help; workbench.analysis.format_report(run.report()) prints it."""
        from workbench.analysis import report

        return report(self.metrics(), self.config, self.stragglers(), self.event_summary().check_counts())


def _job_state(job: Any) -> str:
    if job is None:
        return ""
    try:
        return str(job.state)
    except Exception:  # noqa: BLE001 - the scheduler may not answer; the files still do
        return "UNKNOWN"


def _reattach_job(meta: dict[str, Any], run: RunDir) -> Any:
    job_id = meta.get("job_id")
    if not job_id:
        return None
    if meta.get("executor") == "slurm":
        import submitit

        return submitit.SlurmJob(folder=run.logs, job_id=str(job_id), tasks=tuple(range(meta.get("world_size", 1))))
    if meta.get("executor") == "local":
        return _LocalPid(_controller(meta) or Proc(int(job_id)))
    return None


def _controller(meta: dict[str, Any]) -> Proc | None:
    """The local controller as the submitter recorded it (pid, start time, process group)."""
    return Proc.from_dict(meta.get("controller"))


def live_job(run: RunDir) -> str | None:
    """A description of the job still running in this run folder, or None."""
    meta = read_json(run.meta, {}) or {}
    job = _reattach_job(meta, run)
    if job is None:
        return None
    try:
        done = bool(job.done())
    except Exception:  # noqa: BLE001 - the scheduler does not answer: assume it may be alive
        done = False
    return None if done else f"{meta.get('executor')} job {meta.get('job_id')}"


class _LocalPid:
    """A local job seen from another process: alive while its controller process is (the same
    process: a pid the system gave to someone else since does not count)."""

    def __init__(self, proc: Proc):
        self.proc = proc
        self.job_id = str(proc.pid)

    @property
    def state(self) -> str:
        return "RUNNING" if not self.done() else "FINISHED"

    def done(self) -> bool:
        return not self.proc.alive()

    def cancel(self) -> None:
        self.proc.send(signal.SIGTERM)
