"""The Run handle: a live view of a submitted job through its run folder and its submitit job."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from workbench.config import JobConfig
from workbench.launch.status import RunStatus, overall_state, rank_statuses, total_steps
from workbench.rundir import RunDir, read_json, write_json_atomic
from workbench.stream import MultiTail, RankFrames

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

# After a rank failed, give the others this long to stop themselves before the job is cancelled.
STOP_GRACE_S = 10.0


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

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.host}) raised {self.type}: {self.message}"


class Run:
    """A submitted (or finished) run.  Cheap to poll: files are tailed by byte offset."""

    def __init__(self, run_dir: str | Path, job: Any = None):
        self.dir = RunDir(Path(run_dir))
        self.job = job
        self._metrics = RankFrames(self.dir.root / "metrics")
        self._events = MultiTail(self.dir.root / "events")
        self._failed_at: float | None = None
        self._health_seen = 0
        self._health: dict[str, Any] = {"in_sync": None, "diverged_ranks": [], "first_diverged": None,
                                        "stragglers": {}, "shards_ok": None, "warnings": []}

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

    @property
    def config(self) -> JobConfig:
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
        done = self.job_done()
        ranks = rank_statuses(self.dir, self.world_size, done)
        state = overall_state(self.dir, ranks, done, bool(self.meta.get("cancelled")))
        step = min((r.step for r in ranks), default=0)
        self._events.poll()
        return RunStatus(state, ranks, step, total_steps(self._events.records), _job_state(self.job))

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
        """A rank failed: the others stop themselves; cancel the job if some are still there later."""
        if status.state != "failed" or self.job_done():
            return
        self._failed_at = self._failed_at or time.monotonic()
        if time.monotonic() - self._failed_at > STOP_GRACE_S:
            self.job.cancel()

    def cancel(self) -> None:
        """Stop every rank.  The latest finished checkpoint and all logged metrics stay."""
        meta = self.meta
        meta["cancelled"] = time.time()
        write_json_atomic(self.dir.meta, meta)
        if self.job is not None and not self.job_done():
            self.job.cancel()

    # --- results ---------------------------------------------------------------------------------
    def poll_metrics(self) -> list[dict[str, Any]]:
        """Metric records written since the last poll (also kept for metrics())."""
        return self._metrics.poll()

    def metrics(self, max_points: int | None = None) -> pd.DataFrame:
        """Every logged step of every rank (rank, step, loss, loss_reduced, lr, step_time_s, ...),
        read incrementally.  After a requeue, steps trained again keep the newest attempt's row."""
        self._metrics.poll()
        return self._metrics.frame(max_points)

    def events(self) -> pd.DataFrame:
        self._events.poll()
        from workbench.stream import to_frame

        return to_frame(self._events.records, ("time",))

    def logs(self, rank: int = 0, stream: str = "both", tail_bytes: int | None = None) -> str:
        """The rank's stdout and stderr (submitit's per-task log files)."""
        parts = []
        for suffix in ({"out": ["out"], "err": ["err"]}.get(stream, ["out", "err"])):
            for path in sorted(self.dir.logs.glob(f"*_{rank}_log.{suffix}")):
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
        """The first failure: the earliest rank error, or a rank that vanished without one."""
        errors = [read_json(self.dir.error(r)) for r in self.dir.ranks_with("errors")]
        errors = sorted((e for e in errors if e), key=lambda e: e.get("time", 0))
        lost = [r for r in (status or self.status()).ranks if r.state == "lost"]
        if lost:
            r = lost[0]
            return RankFailure(r.rank, "Lost", f"rank {r.rank} stopped without reporting an error "
                               "(killed by a signal, or out of memory?)", self.logs(r.rank, tail_bytes=4000), r.host)
        if errors:
            e = errors[0]
            return RankFailure(e["rank"], e["type"], e["message"], e["traceback"], e.get("host", ""))
        return None

    def health(self, status: RunStatus | None = None) -> dict[str, Any]:
        """What the ranks' own checks said, from their events (read incrementally): parameters in
        sync at the last check, stragglers, stalled ranks, data-sharding problems and warnings."""
        self._events.poll()
        for record in self._events.records[self._health_seen:]:
            _fold_health(self._health, record)
        self._health_seen = len(self._events.records)
        stalled = [r.rank for r in (status or self.status()).ranks if r.stalled or r.silent]
        return {**self._health, "stalled_ranks": stalled}

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

        return report(self.metrics(), self.config, self.events())


def _fold_health(health: dict[str, Any], record: dict[str, Any]) -> None:
    kind = record.get("event")
    if kind == "sync_check":
        health.update(in_sync=record["in_sync"], diverged_ranks=record.get("diverged_ranks") or [],
                      first_diverged=record.get("first_diverged"))
    elif kind == "straggler":
        health["stragglers"][record["straggler_rank"]] = record["slower_by"]
    elif kind == "shard_check" and "ok" in record:
        health["shards_ok"] = record["ok"]
    elif kind == "warning":
        health["warnings"].append(f"rank {record['rank']}: {record.get('message', '')}")


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
        return _LocalPid(int(job_id))
    return None


class _LocalPid:
    """A local job seen from another process: alive while its controller process is."""

    def __init__(self, pid: int):
        self.pid = pid

    @property
    def state(self) -> str:
        return "RUNNING" if not self.done() else "FINISHED"

    def done(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    def cancel(self) -> None:
        import signal

        if not self.done():
            os.kill(self.pid, signal.SIGINT)
