"""What a terminal shows of a run: its start, live progress, the end-of-run table and failures."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any


def follow(run: Any, quiet: bool = False, owned: bool = False, ranks: str | None = None) -> int:
    """Stream a run's progress to the terminal; per-rank table and plot at the end; 1 if it failed.

    An owner (`workbench run`, `workbench launch`) cancels the run when stopped by a signal or when
    this loop fails; a follower (`workbench follow`) only stops following."""
    from workbench.cli.owner import Interrupted, cancel_owned, check_stop

    printer = ProgressPrinter(quiet=quiet, ranks=ranks)

    def poll(run: Any) -> None:
        check_stop()  # a stop signal is raised here, between polls (never inside an import)
        printer(run)

    try:  # a stop signal from here on (even right after the first line) ends the follow cleanly
        print(f"[workbench] run folder: {run.folder}", flush=True)
        status = run.wait(on_poll=poll)
    except Interrupted as stop:
        if not owned:
            print(f"\n[workbench] stopped following; the run goes on (workbench cancel {run.folder} stops it)")
            return 128 + stop.signum
        status = cancel_owned(run, stop.args[0])
        _say_end(run, status)
        return 128 + stop.signum
    except BaseException:
        if owned:
            cancel_owned(run, "the follow loop failed")
        raise
    printer(run)
    return _say_end(run, status)


def _say_end(run: Any, status: Any) -> int:
    """The per-rank table, plot and final state; the failure if the run failed.  0 if it finished."""

    from workbench.results.plots import save_run_plot

    with contextlib.suppress(OSError):  # the terminal may be gone
        frame = run.metrics()
        if len(frame):
            plot = save_run_plot(frame, str(run.dir.plots / "loss.png"))
            print(f"[workbench] per-rank plot: {plot}")
            print(per_rank_table(frame).to_string())
        print(f"[workbench] {status if status is not None else 'ranks still stopping: ' + str(run.status())}",
              flush=True)
        if status is not None and status.state == "failed":
            _print_failure(run)
    return 0 if status is not None and status.state == "finished" else 1


class ProgressPrinter:
    """Prints each rank's latest metric record as it streams in, at most one line per rank per second."""

    KNOWN = ("loss", "loss_reduced", "lr", "samples_per_s", "step_time_s", "comm_wait_s", "mem_mb")
    HIDDEN = {"rank", "step", "time", "epoch", "attempt", "data_time_s", "comm_busy_s", *KNOWN}

    def __init__(self, quiet: bool = False, every_s: float = 1.0, ranks: str | None = None):
        self.quiet, self.every_s, self.ranks = quiet, every_s, ranks
        self.output: Any = None
        self.last: dict[int, tuple[float, int]] = {}  # rank -> (when printed, step printed)
        self.started = False

    def __call__(self, run: Any) -> None:
        if self.quiet:
            return
        if not self.started:
            self.started = print_start(run)
        self.print_output(run)
        now = time.monotonic()
        for rank, frame in sorted(run.metric_frames.frames.items()):
            printed_at, printed_step = self.last.get(rank, (-self.every_s, -1))
            if not len(frame) or now - printed_at < self.every_s:
                continue
            rec = {k: v for k, v in frame.iloc[-1].items() if v == v}  # NaN: a field this record lacks
            if int(rec.get("step", -1)) == printed_step:
                continue
            self.last[rank] = (now, int(rec.get("step", -1)))
            print(f"  rank {rank} | step {int(rec['step']):>6} | " + format_record(rec), flush=True)


    def print_output(self, run: Any) -> None:
        """Each chosen rank's new stdout and stderr lines, prefixed [rank N], as they come."""
        from workbench.launch.output import RankOutput, shown_streams

        if self.output is None:
            self.output = RankOutput(run.dir, shown_streams(run.world_size, self.ranks))
        for rank, kind, line in self.output.poll():
            print(f"[rank {rank}] {line}", file=sys.stderr if kind == "err" else sys.stdout, flush=True)


def print_start(run: Any) -> bool:
    """Print the derived numbers of rank 0's start event once it is there; returns whether it was."""
    e = run.event_summary().start
    needed = ("world_size", "device", "effective_batch", "lr", "warmup_steps", "steps_per_epoch", "total_steps")
    if not e or any(k not in e for k in needed):
        return False
    print(f"[workbench] {e['world_size']} ranks on {e['device']}: effective batch {e['effective_batch']}, "
          f"lr {e['lr']:.3g}, warmup {e['warmup_steps']} steps, {e['steps_per_epoch']} steps/epoch, "
          f"{e['total_steps']} steps in all", flush=True)
    return True


def format_record(rec: dict[str, Any]) -> str:
    """The engine's fields in a fixed readable order, then whatever else a script logged."""
    parts = []
    if "loss" in rec:
        reduced = f" (all ranks {rec['loss_reduced']:.4g})" if "loss_reduced" in rec else ""
        parts.append(f"loss {rec['loss']:.4g}{reduced}")
    if "lr" in rec:
        parts.append(f"lr {rec['lr']:.2e}")
    if "samples_per_s" in rec:
        parts.append(f"{rec['samples_per_s']:.0f} samples/s")
    if "step_time_s" in rec:
        comm = rec.get("comm_wait_s")
        share = f" ({100 * comm / rec['step_time_s']:.0f}% comm)" if comm == comm and comm is not None else ""
        parts.append(f"step {1000 * rec['step_time_s']:.1f} ms{share}")
    if "mem_mb" in rec:
        parts.append(f"{rec['mem_mb']:.0f} MiB")
    parts += [f"{k} {_fmt(v)}" for k, v in rec.items() if k not in ProgressPrinter.HIDDEN]
    return " | ".join(parts)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def per_rank_table(frame: Any) -> Any:
    """Last step, final loss, mean step time and throughput, peak memory per rank (those logged)."""
    wanted = {"step": ("step", "max"), "final_loss": ("loss", "last"), "step_time_s": ("step_time_s", "mean"),
              "samples_per_s": ("samples_per_s", "mean"), "mem_mb": ("mem_mb", "max")}
    return frame.groupby("rank").agg(**{k: v for k, v in wanted.items() if v[0] in frame})


def _print_failure(run: Any) -> None:
    failure = run.exception()
    if failure is not None:
        print(f"[workbench] {failure}\n{failure.traceback}", file=sys.stderr)


def print_history(run: Any) -> None:
    """Earlier attempts' failures (restarted), the checkpoint resumed from and any skipped, a cancel."""
    summary = run.event_summary()
    current = {(f.rank, f.attempt) for f in [run.exception()] if f is not None}
    for failure in run.failures():
        if (failure.rank, failure.attempt) in current:
            continue
        tail = "\n".join(failure.traceback.rstrip().splitlines()[-12:])
        print(f"[workbench] attempt {failure.attempt} failed: {failure}\n{tail}")
    for restart in summary.restarts:
        print(f"[workbench] restart {restart.get('restart')}/{restart.get('max_restarts')} "
              f"(attempt {restart.get('attempt')}) from the latest checkpoint")
    if summary.resumed_from:
        print(f"[workbench] resumed from {summary.resumed_from}")
    for skipped in summary.skipped_checkpoints:
        print(f"[workbench] skipped unreadable checkpoint {skipped}")
    if run.meta.get("cancelled"):
        print(f"[workbench] cancelled ({run.meta.get('cancelled_by', 'by the user')})")

