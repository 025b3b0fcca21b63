"""The Run handle: a live view of a submitted job through its run folder and its submitit job."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.scaling import effective_batch
from workbench.config.sections import DistConfig, JobConfig
from workbench.config.types import shown
from workbench.errors import ArgumentError, ConfigError, RunFailed, RunFolderError, SubmitError
from workbench.launch.ours import say_not_signalled, signallable
from workbench.launch.pooljob import PoolJob
from workbench.launch.status import RunStatus, pruned_mark, run_status
from workbench.proctree import Proc, end, signal_name
from workbench.runfolder import events as kinds
from workbench.runfolder.causes import RankFailure, cause_of, from_record, stopped_because
from workbench.runfolder.events import EventSummary
from workbench.runfolder.failures import controller_failure, last_traceback, write_controller_failure
from workbench.runfolder.layout import RunDir, read_json
from workbench.runfolder.private import check_trusted, open_regular
from workbench.runfolder.rankstate import ENDED_RANK_STATES, is_lost, lost_message, process_there
from workbench.runfolder.reader import MultiTail, RankFrames
from workbench.runfolder.records import ERROR, EVENT, read_object, warn_damaged

if TYPE_CHECKING:
    import pandas as pd

STACKS_MAX_BYTES = 1 << 20
"""The most of a rank's stack dump that is read (its end)."""
STOP_GRACE_S = 30.0
"""After a rank failed, its agents end the attempt within seconds; this handle ends the job itself
(controller, agents, workers) only if something is still there after this long."""
STRAGGLERS_LIVE_EVERY_S = 15.0
"""While a run goes, the straggler verdict (over every logged record) is recomputed at most this often."""


ENDING_POLL_S = 0.05
"""Once the outcome is known, Run.wait looks this often for the job's processes to be gone."""
MAX_WORLD_SIZE = 1 << 16
"""The most ranks a run folder is read for (a damaged run.json must not make a reader loop for ever)."""
SCHEDULER_RETRY_S = 10.0
"""While SLURM cannot be asked about a run's job (its controller or accounting does not answer),
a live view (Run.wait, the dashboard) asks it again this often."""
SUMMARY_AFTER_FINISHED_S = 5.0
"""How long `result()` waits for the summary of a run whose ranks all said finished: rank 0 writes it
just after its own status (engine/rank.py, engine/script.py), and a wait() that saw the statuses, with
SLURM not answering, can return in between."""
ROLES = ("controller", "agent", "worker")
"""The processes a local run's folder names (workbench.runfolder.layout.RunDir.named)."""


class Run:
    """A submitted (or finished) run.  Cheap to poll: files are tailed by byte offset.

    The handle owns the one reader of the run's metrics and events; the CLI, the dashboard and the
    report all read through it, so each record is parsed once and every view shows the same."""

    def __init__(self, run_dir: str | Path, job: Any = None):
        self.dir = RunDir(Path(run_dir))
        self.job = job
        self.metric_frames = RankFrames(self.dir.folder("metrics"))
        """The one incremental reader of every rank's metrics (shared with the dashboard)."""
        self.reading = threading.RLock()
        """Held for one snapshot (workbench.ui.state.read_state: the status, then the metrics that poll
        read): every poll of this handle takes it, so a second dashboard, Run.wait or a cell polling the
        same handle cannot move the reader on between the status and the curves of one refresh."""
        self._events = MultiTail(self.dir.folder("events"), schema=EVENT)
        self._summary = EventSummary()
        self._stragglers: tuple[int, pd.DataFrame, float, bool] | None = None
        self._metrics: tuple[tuple[int, int | None], pd.DataFrame] | None = None
        self._failed_at: float | None = None
        self._config_for_views: JobConfig | None = None
        self._meta_snapshot: dict[str, Any] | None = None
        self.latest_status: RunStatus | None = None
        """The status Run.wait read last (what its on_poll callback may show)."""
        self.scheduler_error: str | None = None
        """Why the scheduler could not be asked about the job at the last look, in one line naming
        the job and carrying SLURM's own message (None when it answered)."""
        self._scheduler_said = ""
        self._asked_at = 0.0
        self._warned: str | None = None
        self.not_signalled = ""
        """Why the last stop left processes the folder names alone, in one line (also warned, a
        NotSignalledWarning): the folder is not the user's own and private, or a process is not
        the workbench process its record names (workbench.launch.ours).  "" when none was."""

    @classmethod
    def load(cls, run_dir: str | Path, snapshot: bool = False) -> Run:
        """Reattach to a run folder (after a kernel restart): SLURM jobs are followed again.
        `snapshot`: the handle keeps the run.json it read here instead of reading it at every look
        (a row of workbench.runs(), read once and kept, looked at it six times)."""
        run = RunDir(Path(run_dir))
        if not run.root.is_dir():
            what = "not a folder" if run.root.exists() else "no such folder"
            raise RunFolderError(f"{shown(run_dir)}: {what}; give the run folder `workbench run` printed")
        meta = run.read_meta()
        if meta is None:
            why = "its run.json is damaged" if run.meta.exists() else "no run.json"
            raise RunFolderError(f"{shown(run_dir)}: not a workbench run folder ({why}); give the folder a run "
                                 "printed, e.g. runs/quickstart-20250101-120000-000")
        handle = cls(run.root, _reattach_job(meta, run))
        if snapshot:
            handle._meta_snapshot = meta
        return handle

    @property
    def folder(self) -> Path:
        return self.dir.root

    @property
    def meta(self) -> dict[str, Any]:
        if self._meta_snapshot is not None:
            return self._meta_snapshot
        return self.dir.read_meta() or {}

    @functools.cached_property
    def config(self) -> JobConfig:
        """The config snapshot in the run folder (read once per handle)."""
        return JobConfig.from_yaml(self.dir.config)

    @functools.cached_property
    def world_size(self) -> int:
        """Fixed for the life of a handle (read once from run.json, not on every poll); a damaged
        run.json gives the ranks that left files."""
        world = self.meta.get("world_size")
        if isinstance(world, int) and 1 <= world <= MAX_WORLD_SIZE:
            return world
        found = [r for kind in ("status", "metrics", "errors") for r in self.dir.ranks_with(kind)]
        return min(max(found, default=0) + 1, MAX_WORLD_SIZE)

    def __repr__(self) -> str:
        status, _ = self.live_status()  # a repr never raises: SLURM not answering is said, not thrown
        return f"Run({str(self.folder)!r}, {status.state}{' (SLURM not answering)' if status.scheduler_error else ''})"

    # --- state -----------------------------------------------------------------------------------
    def job_done(self) -> bool:
        """The job has ended: its scheduler says so and, for a local run, none of the processes its
        agents recorded is left (a controller that was killed leaves its agents ending their workers).
        Raises SubmitError (one line, SLURM's own words) when SLURM cannot be asked."""
        ended = self.job_ended()
        if ended is None:
            raise SubmitError(self._scheduler_said)
        return ended

    def job_ended(self) -> bool | None:
        """job_done(), or None while the scheduler cannot be asked (SLURM's controller or accounting
        does not answer): `scheduler_error` then says why, in one line.  While it cannot, SLURM is
        asked again at most every SCHEDULER_RETRY_S (in between, the last answer stands)."""
        if self.job is None:
            return True
        try:
            done = self._ask_scheduler()
        except SubmitError as exc:
            self._scheduler_said = str(exc)
            job_id = getattr(self.job, "job_id", None) or self.meta.get("job_id", "?")
            self.scheduler_error = f"SLURM cannot be asked about job {job_id}: {exc}"
            return None
        self.scheduler_error, self._scheduler_said = None, ""
        return done and not self._local_processes_left()

    def _ask_scheduler(self) -> bool:
        """The job's own done(); once SLURM failed to answer, a new sacct every SCHEDULER_RETRY_S
        (through the job's watcher: submitit's force_check does not reach a multi-task job's tasks),
        so that a view sees the controller come back without waiting for submitit's backoff (minutes)."""
        watcher = getattr(self.job, "watcher", None)
        if self.scheduler_error is None or watcher is None:
            self._asked_at = time.monotonic()
        elif time.monotonic() - self._asked_at >= SCHEDULER_RETRY_S:
            self._asked_at = time.monotonic()
            watcher.update()  # says a failure by keeping it (workbench.launch.executors.SlurmWatcher)
        return bool(self.job.done())

    def _local_processes_left(self) -> bool:
        meta = self.meta
        if meta.get("executor") != "local" or meta.get("submit_host", socket.gethostname()) != socket.gethostname():
            return False
        return any(p.alive() for p in self.dir.recorded("agent") + self.dir.recorded("worker"))

    def status(self, job_done: bool | None = None) -> RunStatus:
        """Where the run stands: run and rank states, steps, rate (workbench.launch.status).
        `job_done`: the job's state when the caller just asked for it."""
        with self.reading:
            return self._status(job_done)

    def _status(self, job_done: bool | None) -> RunStatus:
        done = self.job_done() if job_done is None else job_done
        meta = self.meta
        self.metric_frames.poll()  # after job_done: once it says done, every record is on disk
        return run_status(self.dir, self.world_size, done, meta.get("cancelled"),
                          self.metric_frames.columns(("step", "time")), self.event_summary().total_steps,
                          _job_state(self.job), lost_after_s=self._lost_after_s(), pruned=pruned_mark(meta))

    def live_status(self) -> tuple[RunStatus, bool]:
        """(status, whether the job ended), for a view that follows the run (Run.wait, the dashboard).
        Never raises for SLURM: while it cannot be asked, the status is the run folder's alone, with
        `status.scheduler_error` saying why in one line, and the job counts as ended once every rank
        has said how it ended (or is lost: no heartbeat for dist.lost_after_s)."""
        with self.reading:
            return self._live_status()

    def _live_status(self) -> tuple[RunStatus, bool]:
        ended = self.job_ended()
        status = self.status(bool(ended))
        if ended is not None:
            return status, ended
        settled = bool(status.ranks) and all(r.state in ENDED_RANK_STATES for r in status.ranks)
        if settled:
            status = self.status(True)  # the job's end as its ranks tell it (a cancel reads as cancelled)
        status.scheduler_error = self.scheduler_error or ""
        return status, settled

    def event_summary(self) -> EventSummary:
        """The run's events folded once (incrementally): total steps, sync checks, warnings."""
        new = self._events.poll()
        return self._summary.fold(new)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5,
             on_poll: Callable[[Run], None] | None = None) -> RunStatus:
        """Block until the run is finished, failed, cancelled or pruned (or `timeout` seconds passed).
        While SLURM cannot be asked about the job, it warns once (one line in SLURM's words) and
        goes on waiting on the run folder, asking SLURM again every SCHEDULER_RETRY_S."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status, ended = self.live_status()
            self.latest_status = status
            self._warn_scheduler(status)
            if on_poll is not None:
                on_poll(self)
            self._stop_survivors(status)
            if status.done and (ended or self.not_signalled):
                return status  # read after the job ended (or its survivors are not ours to end): a rank that
                # died shows so, never as running
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.folder} still {status.state} after {timeout} s: {status}")
            if status.done:  # the outcome is known, the processes are ending: look often, and cheaply
                until = time.monotonic() + poll_s
                while time.monotonic() < until and not self.job_ended():
                    time.sleep(ENDING_POLL_S)
            else:
                time.sleep(poll_s)

    def _warn_scheduler(self, status: RunStatus) -> None:
        """One warning when SLURM stops answering (not one per poll); again after it answered."""
        if status.scheduler_error and status.scheduler_error != self._warned:
            warnings.warn(f"{status.scheduler_error} (the run may still be running: waiting on its run folder, "
                          f"and asking SLURM again every {SCHEDULER_RETRY_S:g} s)", RuntimeWarning, stacklevel=3)
        self._warned = status.scheduler_error or None

    def _stop_survivors(self, status: RunStatus) -> None:
        """A rank failed: its agents end the attempt; end the job here if it is still there later
        (not while SLURM cannot be asked: neither could it be told to cancel).  When none of what a
        local run's folder names is ours to signal, there is nothing to wait for: it is said now."""
        if status.state != "failed" or status.scheduler_error or self.job_ended() is not False:
            return
        if self._failed_at is None:
            self._failed_at = time.monotonic()
            if self._local() and not signallable(self.dir, ROLES)[0]:
                self._stop_job()  # signals nothing; says why in one line
                return
        if time.monotonic() - self._failed_at > STOP_GRACE_S:
            self._stop_job()

    def cancel(self, by: str = "", *, wait: bool = True) -> None:
        """Stop every rank, from any handle (the submitting one, or Run.load after a kernel restart).
        Returns once they are gone (a local run: at most about STOP_GRACE_S).  The latest finished
        checkpoint and all logged metrics stay; the run is reported as cancelled, `by` whom (default:
        Run.cancel() and the process that called it).  `wait=False` asks the ranks to stop and returns
        at once: stopping several runs, ask each first, then wait for each (cancel() again)."""
        if self.job_done() and self.status().done:
            return  # it ended already: a finished run stays finished
        if self._local():
            ours, refused = signallable(self.dir, ROLES)
            if refused and not ours:  # none of it is ours to stop: not marked cancelled either
                self.not_signalled = say_not_signalled(self.folder, refused)
                return
        self.dir.mark_cancelled(by or f"Run.cancel() in pid {os.getpid()} on {socket.gethostname()}")
        if wait:
            self._stop_job()
        else:
            self._ask_stop()

    def _ask_stop(self) -> None:
        """SIGTERM to the local controller, the pool's cancel file or scancel, without waiting."""
        if isinstance(self.job, PoolJob):
            self.job.cancel()
        elif self._local():
            controller, refused = signallable(self.dir, ("controller",))
            for proc in controller:
                proc.send(signal.SIGTERM)  # it asks its agents to stop; a second SIGTERM changes nothing
            self.not_signalled = say_not_signalled(self.folder, refused)
        elif self.job is not None and not self.job_done():
            self.job.cancel()

    def _local(self) -> bool:
        return isinstance(self.job, _LocalPid) or self.meta.get("executor") == "local"

    def _stop_job(self) -> None:
        if isinstance(self.job, PoolJob):  # this job only: the pool ends its workers and starts fresh ones
            self.job.cancel()
            self.job.wait(STOP_GRACE_S)
        elif self._local():
            host = self.meta.get("submit_host")
            if host and host != socket.gethostname():
                raise RuntimeError(f"run {self.folder} runs on {host}: cancel it there (workbench cancel)")
            self.not_signalled = stop_local(self.dir)
            if self.job is not None:
                self.job_done()  # reap our own child
        elif self.job is not None and not self.job_done():
            self.job.cancel()

    # --- results ---------------------------------------------------------------------------------
    def metrics(self, max_points: int | None = None) -> pd.DataFrame:
        """Every logged step of every rank (rank, step, loss, loss_reduced, lr, step_time_s, ...),
        read incrementally.  After a requeue, steps trained again keep the newest attempt's row.
        `time` stays Unix seconds; `wall_time` is it as a datetime (UTC), `elapsed_s` the seconds
        since the run folder was made and `samples` the samples seen (step x effective batch)."""
        from workbench.results.metricview import add_derived

        self.metric_frames.poll()
        key = (self.metric_frames.version, max_points)
        if self._metrics is None or self._metrics[0] != key:  # a live view asks every second; often nothing is new
            frame = add_derived(self.metric_frames.frame(max_points), self.meta.get("created"), self.samples_per_step(),
                                self.sample_batches())
            self._metrics = (key, frame)
        return self._metrics[1].copy(deep=False)

    def sample_batches(self) -> tuple[tuple[int, int], ...]:
        """(the step it started from, effective batch) of each stretch, where a continue changed the
        effective batch (empty otherwise: samples_per_step counts them all)."""
        batches = self.event_summary().batches
        return tuple(batches) if len({b for _, b in batches}) > 1 else ()

    def samples_per_step(self) -> int | None:
        """The effective batch: rank 0's start event says it, else the config (None in script mode
        without one)."""
        start = self.event_summary().start or {}
        if start.get("effective_batch"):
            return int(start["effective_batch"])
        if self.meta.get("script"):
            return None  # a script's batches are its own business
        try:
            t = self.config.train
        except (OSError, ValueError):
            return None
        return effective_batch(t.micro_batch_size, t.grad_accum_steps, self.world_size)

    def events(self) -> pd.DataFrame:
        from workbench.runfolder.reader import to_frame

        self.event_summary()
        return to_frame(self._events.records, ("time",))

    def logs(self, rank: int = 0, stream: str = "both", tail_bytes: int | None = None) -> str:
        """The rank's stdout and stderr: "both" interleaved in the order the rank wrote them (its
        agent's logs/rank{R}.log), "out" or "err" alone (submitit's per-task log files, which also
        hold the launcher's own lines)."""
        if stream == "both" and self.dir.both_streams(rank).exists():
            return _read_text(self.dir.both_streams(rank), tail_bytes)
        parts = []
        for suffix in ({"out": ["out"], "err": ["err"]}.get(stream, ["out", "err"])):
            for path in self.dir.log_files(rank, suffix):
                parts.append(_read_text(path, tail_bytes))  # a log of gigabytes costs only its tail
        return "".join(parts)

    def result(self) -> dict[str, Any]:
        """The run summary; raises RunFailed (with the failing rank's traceback) if it failed."""
        status, _ = self.live_status()  # the ranks' word: SLURM not answering does not hide a summary
        if status.state == "failed":
            raise RunFailed(self.exception(), self.folder)
        summary = self.dir.read_summary()
        deadline = time.monotonic() + SUMMARY_AFTER_FINISHED_S
        while summary is None and status.state == "finished" and time.monotonic() < deadline:
            time.sleep(0.05)  # the ranks said finished; rank 0 writes the summary just after its status
            summary = self.dir.read_summary()
        if summary is None:
            raise RuntimeError(f"run {self.folder} is {status.state}: no summary yet")
        return summary

    def results(self, trust: bool = False) -> list[Any]:
        """Every rank's return value, in rank order (a run of workbench.submit_fn); raises RunFailed
        (with the failing rank's traceback) if it failed.  The values are pickles, code that runs as
        you when read: read only from a run folder that is your own and writable by no one else
        (UntrustedFileError names the file and its owner), or with `trust=True`."""
        import pickle

        status, _ = self.live_status()
        if status.state == "failed":
            raise RunFailed(self.exception(status), self.folder)
        if status.state != "finished":
            raise RuntimeError(f"run {self.folder} is {status.state}: no results yet")
        found = self.dir.rank_files("results")
        missing = [r for r in range(self.world_size) if r not in found]
        if missing:
            raise RuntimeError(f"run {self.folder} has no return value for ranks {missing} (not a submit_fn run?)")
        for r in range(self.world_size):
            check_trusted(self.folder, found[r], trust)
        values = []
        for r in range(self.world_size):
            with open_regular(found[r]) as fh:
                values.append(pickle.load(fh))
        return values

    def exception(self, status: RunStatus | None = None) -> RankFailure | None:
        """Why the latest attempt failed (workbench.runfolder.causes, the one rule every view uses):
        the earliest failure that is not a knock-on error (a reset connection, a collective's
        timeout, a rank that stopped because of it), carrying every other failure of the attempt as
        its consequences.  Failures are rank errors, ranks that ended without a word (dated by their
        last heartbeat) and a controller that died; when none left a word at all, the last
        traceback in a rank's stderr (an error before the rank could report)."""
        status = status or self.live_status()[0]
        failures = [from_record(rank, e) for rank, e in self._errors().items()]
        failures += self._gone(status, {f.rank for f in failures})
        cause = cause_of(failures)
        if cause is None and status.state == "failed":
            cause = self._failure_from_stderr()
        return self._with_stopped_ranks(cause, status) if cause is not None else None

    def _errors(self) -> dict[int, dict[str, Any]]:
        """rank -> its error record (a damaged error file reads as absent, with a warning)."""
        found = {rank: self.dir.read_error(rank) for rank in self.dir.rank_files("errors")}
        return {rank: _shown_traceback(e) for rank, e in found.items() if e is not None}

    def _gone(self, status: RunStatus, reported: set[int]) -> list[RankFailure]:
        """Ranks that ended without a word (lost), and the local controller if it died."""
        found = []
        for r in status.ranks:
            if r.state == "lost" and r.rank not in reported:
                age = r.heartbeat_age_s or 0.0
                silent = age if is_lost(age, self._lost_after_s()) else None  # else the job ended soon after a beat
                there = process_there(self.dir.read_status(r.rank))  # from its node: stopped, or gone
                found.append(RankFailure(r.rank, "Lost", lost_message(r.rank, silent, there=there),
                                         self.logs(r.rank, tail_bytes=4000), r.host, r.attempt, time.time() - age,
                                         reported_by="reader"))
        found += self._hung(status, reported | {f.rank for f in found})
        job_id = str(self.meta.get("job_id") or "")
        if job_id and status.state == "failed":
            self._controller_seen_dying(job_id)
        record = controller_failure(self.dir, job_id) if job_id else None
        if record is None:
            return found
        controller = from_record(-1, {**record, "rank": -1})
        # a rank seen ending without a word after the controller died was stopped by that death
        stopped = [stopped_because(controller, f.rank, False, f.host, f.attempt, f.time) if f.type == "Lost" else f
                   for f in found]
        return [*stopped, controller]

    def _hung(self, status: RunStatus, reported: set[int]) -> list[RankFailure]:
        """Ranks their own heartbeat named hung in this attempt (dist.on_hang: warn leaves no error
        file): when the run fails later, by a collective's timeout, the hang is its cause."""
        self.event_summary()
        attempts = {r.rank: r.attempt for r in status.ranks}
        hung = [e for e in self._events.records if e.get("event") == kinds.HUNG and e["rank"] not in reported
                and e.get("attempt", 0) == attempts.get(e["rank"])]
        return [from_record(int(e["rank"]), {**e, "type": "Hung", "reported_by": "itself"}) for e in hung]

    def _controller_seen_dying(self, job_id: str) -> None:
        """The local controller this handle started ended by a signal: written down here (whoever
        sees a death first records it; only its parent knows the signal, which it adds)."""
        process = getattr(self.job, "_process", None)
        code = process.poll() if process is not None else None
        if process is None or code is None or code >= 0:
            return
        message = f"the local controller (pid {process.pid}) was killed by {signal_name(code)}; every rank stopped"
        with contextlib.suppress(OSError):
            write_controller_failure(self.dir, message, job_id, "the submitting process", exit_code=code)

    def _with_stopped_ranks(self, cause: RankFailure, status: RunStatus) -> RankFailure:
        """Ranks that stopped themselves because of the cause (aborted, no error of their own) are
        listed as consequences too: "waiting for rank N" when they were waiting in a collective."""
        listed = {cause.rank, *(f.rank for f in cause.consequences)}
        for r in status.ranks:
            if r.state == "aborted" and r.rank not in listed:
                waiting = bool((self.dir.read_status(r.rank) or {}).get("waiting"))
                cause.consequences.append(stopped_because(cause, r.rank, waiting, r.host, r.attempt,
                                                          time.time() - (r.heartbeat_age_s or 0.0)))
        return cause

    def _failure_from_stderr(self) -> RankFailure | None:
        for rank in range(self.world_size):
            found = last_traceback(self.logs(rank, "err", tail_bytes=64_000))
            if found is not None:
                kind, message, text = found
                return RankFailure(rank, kind, message, text, reported_by="reader")
        return None

    def failures(self, status: RunStatus | None = None) -> list[RankFailure]:
        """The failure of each attempt on record, oldest first: each restarted attempt's
        (errors/failure-N/) and the current one's, each picked by the same rule as exception()
        and carrying the other failures of its attempt as consequences.  `status`: the one the
        caller just read (else it is read here)."""
        found = []
        for files in self.dir.archived_errors():
            records = [(rank, read_object(path, ERROR)) for rank, path in files.items()]
            cause = cause_of([from_record(rank, _shown_traceback(e)) for rank, e in records if e is not None])
            if cause is not None:
                found.append(cause)
        current = self.exception(status)
        return [*found, current] if current is not None else found

    def health(self, status: RunStatus | None = None) -> dict[str, Any]:
        """What the ranks' own checks said (parameters in sync at the last check, data shards,
        warnings), the stragglers (the same verdict as the report's) and the stalled ranks."""
        found = self.event_summary().health()
        live = status is not None and not status.done
        slow = self.stragglers(max_age_s=STRAGGLERS_LIVE_EVERY_S if live else 0.0)
        found["stragglers"] = dict(zip(slow["rank"].astype(int).tolist(), slow["slower_by"].astype(float).tolist()))
        found["stalled_ranks"] = [r.rank for r in (status or self.live_status()[0]).ranks if r.stalled or r.silent]
        return found

    def stragglers(self, max_age_s: float = 0.0) -> pd.DataFrame:
        """Ranks whose own work per step exceeds the others' median by more than
        dist.straggler_threshold (workbench.results.analysis.stragglers over every logged step): the one
        verdict the dashboard's health line, `workbench show` and the report give.  A live view may
        accept a verdict up to `max_age_s` old, computed over 2,000 evenly spaced steps per rank (all
        records are costly on a long, wide run); a finished run's verdict is always computed over all
        of its records."""
        from workbench.results.analysis import stragglers

        self.metric_frames.poll()
        version = self.metric_frames.version
        cached = self._stragglers
        if max_age_s > 0:
            fresh = cached is not None and (cached[0] == version or time.monotonic() - cached[2] < max_age_s)
        else:
            fresh = cached is not None and cached[0] == version and cached[3]  # over every record
        if cached is None or not fresh:
            # live: medians over 2,000 evenly spaced steps per rank (the same medians, a fraction of the cost)
            frame = self._current_shape(self.metric_frames.frame(2000 if max_age_s > 0 else None))
            cached = (version, stragglers(frame, self._settings().dist.straggler_threshold), time.monotonic(),
                      max_age_s <= 0)
            self._stragglers = cached
        return cached[1]

    def _current_shape(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The steps of the run's current shape, which the report and the stragglers judge: after a
        continue at another world size (or effective batch, or strategy), the ranks that left and the
        steps before it would compare unlike with like (a rank gone since, "2250% slower")."""
        summary = self.event_summary()
        world, since = (summary.start or {}).get("world_size"), summary.shape_since
        if not len(frame) or (world is None and since is None):
            return frame
        if world is not None:
            frame = frame[frame["rank"] < int(world)]
        if since is not None and "time" in frame:
            frame = frame[frame["time"] >= float(since)]
        return frame

    def stacks(self) -> dict[int, str]:
        """Python stack dumps of ranks that stalled (rank -> text), written by the ranks themselves."""
        return {r: _read_text(self.dir.stacks(r), STACKS_MAX_BYTES) for r in range(self.world_size)
                if self.dir.stacks(r).exists()}

    def evals(self) -> pd.DataFrame:
        """The validation results (eval events: step, time, val_loss, val_<metric>, ...), with the
        metrics' elapsed_s and samples columns."""
        from workbench.results.metricview import add_derived

        events = self.events()
        if not len(events) or "event" not in events:
            return events
        evals = events[events["event"] == kinds.EVAL].dropna(axis=1, how="all").reset_index(drop=True)
        return add_derived(evals, self.meta.get("created"), self.samples_per_step(), self.sample_batches())

    def plot(self, interactive: bool = False, **options: Any) -> Any:
        """The run's panels (matplotlib Figure): loss per rank and reduced, validation metrics, lr,
        step time, throughput, peak memory.  Options: x="step"|"samples"|"elapsed_s", log_y,
        smooth (EMA weight 0-0.99), ranks, theme="light"|"dark".  interactive=True gives a widget
        with zoom, pan, hover values and those controls (workbench.ui.MetricsPlot)."""
        if interactive:
            return _widget("plot")(self, **options)
        from workbench.results.plots import plot_run

        return plot_run(self.metrics(), evals=self.evals(), **options)

    def to_tensorboard(self, logdir: str | Path) -> Path:
        """Every rank's scalars and eval results into `logdir`/rank{R} (TensorBoard event files), once
        each; `tensorboard --logdir LOGDIR` shows them (workbench.results.exporters)."""
        from workbench.results.exporters import to_tensorboard

        return to_tensorboard(self, logdir)

    def export_metrics(self, path: str | Path | None = None, format: str | None = None) -> Path:
        """Every rank's metrics as CSV or Parquet (by the file's suffix; default <run>/exports/metrics.csv)."""
        from workbench.results.exporters import export_metrics

        return export_metrics(self, path, format)

    def export_model(self, path: str | Path, step: int | None = None) -> Path:
        """The model's weights from the newest checkpoint (or the one at `step`) as one plain state
        dict at `path`: `torch.load(path)` and the model's `load_state_dict` read it, whichever
        strategy wrote it (an fsdp2 run's shards are joined here, without a process group)."""
        import torch

        from workbench.engine.checkpoint import read_model_state
        from workbench.runfolder.layout import checkpoint_step
        from workbench.runfolder.private import write_atomic

        found = [p for p in self.dir.checkpoint_files() if step is None or checkpoint_step(p) == step]
        if not found:
            which = f"at step {step}" if step is not None else "yet"
            have = ", ".join(str(checkpoint_step(p)) for p in self.dir.checkpoint_files()) or "none"
            raise SubmitError(f"run {self.folder} has no checkpoint {which} (steps with one: {have}); "
                              "export after a checkpoint is written (train.checkpoint_every_steps)")
        buffer = io.BytesIO()
        torch.save(read_model_state(found[-1]), buffer)
        target = Path(path).expanduser().resolve()
        write_atomic(target, buffer.getvalue())
        return target

    def dashboard(self, **kwargs: Any) -> Any:
        """The live dashboard of this run (workbench.ui.Dashboard)."""
        return _widget("dashboard")(self, **kwargs)

    def report(self) -> dict[str, Any]:
        """Step time split (data, compute, communication) per rank, stragglers, memory imbalance and
        what would help; workbench.results.analysis.format_report(run.report()) prints it."""
        from workbench.launch.plancheck import engine_run, lines, stored_check
        from workbench.results.analysis import report

        found = report(self._current_shape(self.metrics()), self._settings(), self.stragglers(),
                       self.event_summary().check_counts())
        found["plan"] = lines(stored_check(self), self.world_size) if engine_run(self) else []
        found["device"] = str((self.event_summary().start or {}).get("device") or "")  # what mem_mb measured
        return found

    def plan(self, probe: bool = True, refresh: bool = False) -> pd.DataFrame:
        """The plan checked against this run, per rank: predicted_peak_mb, measured_peak_mb, peak_error,
        predicted_step_s, measured_step_s, step_error (errors: measured / predicted - 1); attrs["misses"]
        has a line per rank whose peak is more than 10% or step more than 30% off, attrs["notes"] how each
        prediction was had.  The prediction (workbench.plan for this run's config, factory, world size and
        strategy) is computed when first asked and kept in the run folder (plan.json; `refresh` computes it
        again); its step time only once the run has ended, and with `probe` (a few seconds to a minute: it
        measures the model's step on this host).  Measured: each rank's peak over its first two steps
        (CUDA's max_memory_allocated; on CPU torch's MemTracker on the real tensors) and its median step
        time (workbench.launch.plancheck)."""
        from workbench.launch.plancheck import check

        return check(self, probe, refresh)

    def _lost_after_s(self) -> float:
        """The run's dist.lost_after_s, which its ranks' watcher uses too (the default without a config)."""
        return self._settings().dist.lost_after_s if self.dir.config.exists() else DistConfig.lost_after_s

    def _settings(self) -> JobConfig:
        """The run's config for the views (stragglers, report); the defaults, with a warning, when
        the snapshot is damaged, so that the status, health and dashboard still show."""
        if self._config_for_views is None:
            try:
                self._config_for_views = self.config
            except ConfigError as exc:
                warn_damaged(self.dir.config, [(0, str(exc).splitlines()[-1][:200])])
                self._config_for_views = JobConfig()
        return self._config_for_views


def _read_text(path: Path, tail_bytes: int | None = None) -> str:
    """A text file (its last `tail_bytes` only, when given), undecodable bytes replaced; "" if unreadable."""
    try:
        with open_regular(path) as fh:  # a FIFO or a device in a log's place: "" at once
            if tail_bytes:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - tail_bytes))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _shown_traceback(e: dict[str, Any]) -> dict[str, Any]:
    """An error record whose traceback shows the user's frames, unless WORKBENCH_TRACEBACK=full asks
    for every frame."""
    if os.environ.get("WORKBENCH_TRACEBACK") == "full" and e.get("traceback_full"):
        return {**e, "traceback": e["traceback_full"]}
    return e


def _job_state(job: Any) -> str:
    if job is None:
        return ""
    try:
        return str(job.state)
    except Exception:  # noqa: BLE001 - the scheduler may not answer; the files still do
        return "UNKNOWN"


def _reattach_job(meta: dict[str, Any], run: RunDir) -> Any:
    if isinstance(meta.get("pool"), dict):  # run by a warm pool (workbench.Pool)
        return PoolJob.from_meta(meta["pool"], min(int(meta.get("world_size") or 1), MAX_WORLD_SIZE))
    job_id = str(meta.get("job_id") or "")
    if not job_id or not job_id.replace("_", "").isascii() or not job_id.replace("_", "").isdigit():
        return None  # absent, or not a job id a scheduler gave (a damaged or edited run.json)
    world = meta.get("world_size", 1)
    if meta.get("executor") == "slurm":
        from workbench.launch.executors import SlurmJob  # scancel's failures in SLURM's words

        return SlurmJob(folder=run.logs, job_id=job_id, tasks=tuple(range(min(world, MAX_WORLD_SIZE))))
    if meta.get("executor") == "local" and job_id.isdigit():
        return _LocalPid(run, _controller(meta) or Proc(int(job_id)))
    return None


def stop_local(run: RunDir) -> str:
    """End a local job from its folder: the controller (it asks the agents, they end their workers),
    then whatever is left, each only if provably ours (workbench.launch.ours).  Returns the one line,
    also warned, naming what was left alone ("" when nothing was)."""
    controller, refused = signallable(run, ("controller",))
    end(controller, STOP_GRACE_S)
    rest, more = signallable(run, ("agent", "worker"))
    end(rest, 1.0)
    return say_not_signalled(run.root, refused + more)


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

    def __init__(self, run: RunDir, proc: Proc):
        self.run, self.proc = run, proc
        self.job_id = str(proc.pid)

    @property
    def state(self) -> str:
        return "RUNNING" if not self.done() else "FINISHED"

    def done(self) -> bool:
        return not self.proc.alive()

    def cancel(self) -> None:
        """SIGTERM to the controller, if provably ours (else one line says why)."""
        controller, refused = signallable(self.run, ("controller",))
        for proc in controller:
            proc.send(signal.SIGTERM)
        say_not_signalled(self.run.root, refused)


WIDGETS = "workbench.widgets"
"""The entry-point group in which the notebook layer names the widgets a Run opens (pyproject.toml):
`launch/` sits below `ui/` and imports none of it, so `run.dashboard()` finds the widget by name, as
pytest finds its plugins, and another front end can register its own."""


def _widget(name: str) -> Any:
    from importlib.metadata import entry_points

    found = entry_points(group=WIDGETS, name=name)
    if not found:
        raise ArgumentError(f"run.{name}(): no widget {name!r} is installed (entry point group {WIDGETS!r}); "
                            f"reinstall workbench (pip install -e .) or use workbench.ui directly, "
                            f"e.g. workbench.ui.Dashboard(run)")
    return next(iter(found)).load()
