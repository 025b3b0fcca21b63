"""What a terminal shows of a run: its start, live progress, the end-of-run table and failures."""

from __future__ import annotations

import contextlib
import numbers
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def follow(run: Any, quiet: bool = False, owned: bool = False, ranks: str | None = None) -> int:
    """Stream a run's progress to the terminal; per-rank table and plot at the end; 1 if it failed.

    An owner (`workbench run`, `workbench launch`) cancels the run when stopped by a signal or when
    this loop fails; a follower (`workbench follow`) only stops following."""
    from workbench.cli.owner import Interrupted, cancel_owned, check_stop

    printer = ProgressPrinter(quiet=quiet, ranks=ranks)
    notice = FailureNotice()
    plot = EndPlot(run)
    warned = [0]  # warnings printed so far

    def poll(run: Any) -> None:
        check_stop()  # a stop signal is raised here, between polls (never inside an import)
        notice(run)  # first: the cause is said before any progress line of this poll
        printer(run)
        warned[0] = warn_new(run, warned[0])
        plot.when_ready(run.latest_status)

    try:  # a stop signal from here on (even right after the first line) ends the follow cleanly
        print(f"[workbench] run folder: {run.folder}", flush=True)
        status = run.wait(on_poll=poll)
    except Interrupted as stop:
        if not owned:
            print(f"\n[workbench] stopped following; the run goes on (workbench cancel {run.folder} stops it)")
            return 128 + stop.signum
        status = cancel_owned(run, stop.args[0])
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            printer(run, final=True)  # what the ranks printed while they stopped (a save on SIGTERM)
        _say_end(run, status)
        return 128 + stop.signum
    except BaseException:
        if owned:
            cancel_owned(run, "the follow loop failed")
        raise
    printer(run, final=True)
    return _say_end(run, status, notice, plot)


class EndPlot:
    """The end-of-run plot, drawn while the run's processes are still exiting: matplotlib is
    imported in the background while the run trains, and the figure is drawn as soon as the run's
    outcome is known; drawn again at the end only if records came after it."""

    def __init__(self, run: Any):
        import threading

        self.run, self.folder, self.path = run, run.folder, str(run.dir.loss_plot)
        self.drawn: str | None = None
        self._records = -1  # how many records the drawn figure has
        self._drawing: threading.Thread | None = None
        self._importing: threading.Thread | None = None

    def when_ready(self, status: Any) -> None:
        """Called every poll: import once the run logs metrics (a plot will be drawn), draw once
        every rank has ended."""
        import threading

        if self._importing is None and status is not None and status.records:
            self._importing = threading.Thread(target=_import_plots, name="workbench-import-plots", daemon=True)
            self._importing.start()
        if self._drawing is None and status is not None and status.done:
            self._drawing = threading.Thread(target=self._draw, name="workbench-end-plot", daemon=True)
            self._drawing.start()

    def _draw(self) -> None:
        from workbench.launch.run import Run
        from workbench.results.plots import save_run_plot
        from workbench.results.series import MetricData

        with contextlib.suppress(Exception):  # drawn again in the main thread, where a failure shows
            records = self.run.metric_frames.records  # the follow loop's reader holds them all: no second read
            if records:
                data = MetricData.from_run(self.run, Run(self.folder).evals())  # events: its own small reader
                self.drawn, self._records = save_run_plot(data, self.path), records

    def result(self, run: Any, frame: Any) -> str:
        """The plot's path: the one drawn ahead, or drawn now."""
        if self._drawing is not None:
            self._drawing.join()
        if self.drawn is None or self._records != run.metric_frames.records:  # records came after it
            from workbench.results.plots import save_run_plot

            self.drawn = save_run_plot(frame, self.path, evals=run.evals())
        return self.drawn


def _import_plots() -> None:
    with contextlib.suppress(Exception):
        import pandas  # noqa: F401 - the end table's, paid while the run trains

        import workbench.results.plots  # noqa: F401 - matplotlib's import, paid while the run trains


class FailureNotice:
    """The cause of a failed run, said once, as soon as the run is known to have failed (while its
    other ranks are still stopping): one line on stderr.  A full disk or another problem of the
    user's input or environment is said as every command says those, "workbench: ...", and the
    command exits 2."""

    def __init__(self) -> None:
        self.said: Any = None

    def __call__(self, run: Any, status: Any = None) -> None:
        status = status or getattr(run, "latest_status", None)
        if self.said is not None or status is None or status.state != "failed":
            return
        failure = run.exception(status)
        if failure is None:
            return
        self.said = failure
        fix = user_fix(failure)
        line = f"workbench: {failure}; {fix}" if fix is not None else f"[workbench] {failure}"
        with contextlib.suppress(OSError):
            print(line.rstrip("; "), file=sys.stderr, flush=True)


def warn_new(run: Any, shown: int) -> int:
    """Print the warnings the ranks reported since the `shown` first ones (a rank named hung under
    dist.on_hang: warn, a mirror that failed, set_epoch not called); returns how many are shown."""
    warnings = run.event_summary().warnings
    for line in warnings[shown:]:
        with contextlib.suppress(OSError):
            print(f"[workbench] warning: {line}", file=sys.stderr, flush=True)
    return len(warnings)


def user_fix(failure: Any) -> str | None:
    """What to do when the run failed for a reason of the user's input or environment (a full
    disk, a config problem found in a rank); None for any other failure (a bug, a crash)."""
    from workbench.runfolder.causes import user_fix as fix

    return fix(failure)


def _say_end(run: Any, status: Any, notice: FailureNotice | None = None, plot: EndPlot | None = None) -> int:
    """The per-rank table, plot and final state; the failure if the run failed.  0 if it finished
    or a sweep's pruner stopped it (a losing trial, not a failure), 2 if it failed for a reason of
    the user's input or environment (said in one line), else 1."""
    notice = notice or FailureNotice()
    with contextlib.suppress(OSError):  # the terminal may be gone
        logged = status is None or status.records > 0  # none: no table, and no pandas to import for it
        frame = run.metrics() if logged else None
        if frame is not None and len(frame):
            print(f"[workbench] per-rank plot: {(plot or EndPlot(run)).result(run, frame)}")
            print(table_for_people(per_rank_table(frame)))
        print(f"[workbench] {status if status is not None else 'ranks still stopping: ' + str(run.status())}",
              flush=True)
        if status is not None and status.state == "failed":
            _print_failure(run, notice, status)
        print(next_steps(run.folder), flush=True)
    if status is None or status.state not in ("finished", "pruned"):
        return 2 if notice.said is not None and user_fix(notice.said) is not None else 1
    return 0


def next_steps(folder: Any) -> str:
    """Where to look next: the run folder as this shell can name it for `workbench show`, and whole for
    a notebook (whose kernel starts in the notebook's folder, not this shell's)."""
    name = os.path.relpath(folder) if not os.path.relpath(folder).startswith("..") else str(folder)
    return (f"[workbench] next: `workbench show {shlex.quote(name)}`, or in a notebook "
            f"`workbench.Run.load({str(Path(folder).resolve())!r}).dashboard()`")


FORMATS = {"step": "{:,.0f}", "final_loss": "{:.4g}", "step_time_s": "{:.4f}", "samples_per_s": "{:,.0f}",
           "mem_mb": "{:,.0f}"}
"""How each column of the per-rank table is shown; another float column gets 4 significant digits."""


def table_for_people(table: Any, index: bool = True) -> str:
    """A table with its numbers formatted for reading (no 13407.884900): the per-rank columns as
    FORMATS says, other float columns to 4 significant digits, the rest as they are."""
    def shown(column: str) -> Any:
        pattern = FORMATS.get(column, "{:.4g}")
        return lambda value: "" if value != value else (
            pattern.format(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else str(value))

    if index and table.index.name is not None:  # the index a column like the others ('rank' on its own line)
        table, index = table.reset_index(), False
    numeric = [c for c in table.columns if str(c) in FORMATS or table[c].dtype.kind == "f"]
    return str(table.to_string(index=index, formatters={c: shown(str(c)) for c in numeric}))


def summary_line(summary: dict[str, Any]) -> str:
    """Rank 0's summary of a finished run in one line, its numbers for people."""
    evals = summary.get("last_eval") or {}
    steps = summary.get("steps")
    reason = summary.get("stop_reason") or summary.get("status") or "finished"
    parts = [f"{steps} steps ({reason})" if steps is not None else f"{reason} (no step logged)",
             *(f"{name} {_num(value)}" for name, value in evals.items())]
    return "[workbench] summary: " + ", ".join(parts) + (" (last evaluation)" if evals else "")


class ProgressPrinter:
    """One line for all ranks at an even cadence, each rank's values at the same step: every
    `every_steps` steps (chosen from the run's total so a run prints about 20 lines), else every
    `every_s` seconds while the next multiple is slow to come, and every `script_every_s` seconds where
    the total is unknown (a script); the last step when the run ends (`final`)."""

    KNOWN = ("loss", "loss_reduced", "lr", "samples_per_s", "step_time_s", "comm_wait_s", "mem_mb")
    HIDDEN = {"rank", "step", "time", "epoch", "attempt", "data_time_s", "comm_busy_s", *KNOWN}

    STALL_EVERY_S = 30.0
    """A stall is said when it starts, then again every this many seconds while it lasts."""

    def __init__(self, quiet: bool = False, every_s: float = 10.0, ranks: str | None = None,
                 every_steps: int | None = None, script_every_s: float = 2.0):
        self.quiet, self.every_s, self.ranks, self.every_steps = quiet, every_s, ranks, every_steps
        self.script_every_s = script_every_s
        self.stall_said_at: float | None = None
        self.output: Any = None
        self.total: int | None = None
        self.printed_step = 0
        self.printed_at = self.first_seen = 0.0
        self.started = False

    def __call__(self, run: Any, final: bool = False) -> None:
        if self.quiet:
            return
        if not self.started:
            self.started = print_start(run)
            if self.started:
                self.total = run.event_summary().start.get("total_steps")
                self.every_steps = self.every_steps or cadence(self.total)
        self.print_output(run)
        for step in self.due(run, time.monotonic(), final):
            print(progress_line(run.metric_frames.frames, step, self.total), flush=True)
            self.printed_step, self.printed_at = step, time.monotonic()
        self.say_stall(getattr(run, "latest_status", None), time.monotonic())

    def say_stall(self, status: Any, now: float) -> None:
        """While the run is stalled, its status's stall line (RunStatus.stall_line: how long, at which
        step, which rank where): when the stall starts, then every STALL_EVERY_S; the step lines
        stop meanwhile, and this says why."""
        line = status.stall_line() if status is not None else ""
        if not line:
            self.stall_said_at = None
            return
        if self.stall_said_at is None or now - self.stall_said_at >= self.STALL_EVERY_S:
            print(f"[workbench] {line}", flush=True)
            self.stall_said_at = now

    def due(self, run: Any, now: float, final: bool) -> list[int]:
        """The steps to print now: each multiple of every_steps every logging rank has passed, else the
        step they all reached once the wait has passed since the last line (or the run ended)."""
        frames = run.metric_frames.frames
        lasts = [int(steps[-1]) for rank in frames if (steps := frames.column(rank, "step")) is not None
                 and len(steps)]
        if not lasts:
            return []
        if not self.first_seen:
            self.first_seen = self.printed_at = now  # seconds count from the first record
        every = self.every_steps
        wait_s = self.every_s if every else self.script_every_s
        if len(lasts) < run.world_size and not final and now - self.first_seen < wait_s:
            return []  # a rank has not logged yet: wait a little for it, so the line has every rank
        reached = min(lasts)
        if reached <= self.printed_step:
            return []
        steps = list(range((self.printed_step // every + 1) * every, reached + 1, every)) if every else []
        if not steps and (final or now - self.printed_at >= wait_s):
            steps = [reached]
        elif final and steps[-1] != reached:
            steps.append(reached)
        return steps

    def print_output(self, run: Any) -> None:
        """Each chosen rank's new stdout and stderr lines, prefixed [rank N], as they come."""
        from workbench.launch.output import RankOutput, shown_streams

        if self.output is None:
            self.output = RankOutput(run.dir, shown_streams(run.world_size, self.ranks))
        for rank, kind, line in self.output.poll():
            print(f"[rank {rank}] {line}", file=sys.stderr if kind == "err" else sys.stdout, flush=True)


def cadence(total_steps: int | None, lines: int = 20) -> int | None:
    """A round step interval (1, 2, 5, 10, 20, 50, ...) that prints about `lines` lines over the run."""
    if not total_steps:
        return None
    every = 1
    while total_steps / every > lines:
        every = every * 5 // 2 if str(every).startswith("2") else every * 2
    return every


def progress_line(frames: Any, step: int, total: int | None) -> str:
    """Every rank's record at `step` (its last one at or before it) on one line."""
    records = {}
    for rank in frames:
        steps = frames.column(rank, "step")
        at = (steps <= step).nonzero()[0] if steps is not None else []
        if len(at):
            records[rank] = {k: v for k, v in frames[rank].iloc[int(at[-1])].items() if v == v}  # NaN: not logged
    where = f"{step:>{len(str(total))}}/{total}" if total else str(step)
    return f"  step {where} | " + format_records(records)


def format_records(records: dict[int, dict[str, Any]]) -> str:
    """The engine's fields in a fixed readable order, summed or reduced over ranks where that is the
    job's number; the loss (and whatever else a script logged) per rank."""
    values = list(records.values())

    def each(key: str) -> list[Any]:
        return [rec[key] for rec in values if key in rec]

    parts = []
    if each("loss"):
        reduced = each("loss_reduced")
        head = f"{_num(reduced[0])} " if reduced else ""
        parts.append(f"loss {head}{by_rank(records, 'loss', bracket=bool(reduced))}")
    if each("lr"):
        parts.append(f"lr {each('lr')[0]:.4g}")  # this step's (the start line gives the peak)
    if each("samples_per_s"):
        parts.append(f"{sum(each('samples_per_s')):,.0f} samples/s")
    if each("step_time_s"):
        slowest = max(values, key=lambda rec: rec.get("step_time_s", 0.0))
        took, comm = slowest["step_time_s"], slowest.get("comm_wait_s")
        share = f" ({100 * comm / took:.0f}% comm)" if comm is not None and took else ""
        parts.append(f"{1000 * took:,.1f} ms/step{share}")
    if each("mem_mb"):
        parts.append(f"{max(each('mem_mb')):,.0f} MiB")
    extra = dict.fromkeys(k for rec in values for k in rec if k not in ProgressPrinter.HIDDEN)
    parts += [f"{key} {by_rank(records, key)}" for key in extra]
    return " | ".join(parts)


def by_rank(records: dict[int, dict[str, Any]], key: str, bracket: bool = False) -> str:
    """A field's value on each rank ("rank 0 1.21, rank 1 1.25"); above 8 ranks its range; one value
    when there is one rank."""
    found = {rank: rec[key] for rank, rec in records.items() if key in rec}
    if len(found) == 1 and not bracket:
        return _num(next(iter(found.values())))
    if len(found) > 8:
        text = f"{_num(min(found.values()))} to {_num(max(found.values()))} over {len(found)} ranks"
    else:
        text = ", ".join(f"rank {rank} {_num(value)}" for rank, value in found.items())
    return f"({text})" if bracket else text


def _num(value: Any) -> str:
    """A number for people: 4 significant digits below 1000, whole and thousands separated above."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    number = float(value)
    if number.is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    if abs(number) >= 1000:
        return f"{number:,.0f}"
    return f"{number:.4g}" if abs(number) >= 1e-3 else f"{number:.3g}"


def print_start(run: Any) -> bool:
    """Print the derived numbers of rank 0's start event once it is there; returns whether it was."""
    e = run.event_summary().start
    needed = ("world_size", "device", "effective_batch", "lr", "warmup_steps", "steps_per_epoch", "total_steps")
    if not e or any(k not in e for k in needed):
        return False
    print(f"[workbench] {e['world_size']} ranks on {e['device']}: effective batch {e['effective_batch']}, "
          f"peak lr {e['lr']:.4g} after {e['warmup_steps']} warmup steps, {e['steps_per_epoch']} steps/epoch, "
          f"{e['total_steps']} steps in all", flush=True)
    return True


def per_rank_table(frame: Any) -> Any:
    """Last step, final loss (the last value each rank logged of the loss the job logs: loss,
    train_loss, ...; the column says which), step time and throughput, peak memory per rank (those
    logged).  Step time and throughput are the report's own figures (results.analysis.step_breakdown:
    per-rank medians over the steady steps, warm-up left out), so the table and the report agree."""
    from workbench.launch.history import loss_metric
    from workbench.results.analysis import step_breakdown

    loss = loss_metric(frame) or "loss"
    wanted = {"step": ("step", "max"), f"final_{loss}": (loss, "last"), "mem_mb": ("mem_mb", "max")}
    table = frame.groupby("rank").agg(**{k: v for k, v in wanted.items() if v[0] in frame})  # last: skips NaN
    steady = step_breakdown(frame).set_index("rank")
    for column in ("step_time_s", "samples_per_s"):
        if column in frame:
            table[column] = steady[column].reindex(table.index)
    order = ["step", f"final_{loss}", "step_time_s", "samples_per_s", "mem_mb"]
    return table[[c for c in order if c in table]]


def _print_failure(run: Any, notice: FailureNotice | None = None, status: Any = None) -> None:
    """The cause's line (unless `notice` said it already), what followed from it, and the cause's
    traceback; a user's or environment's problem is its one line only."""
    notice = notice or FailureNotice()
    status = status or run.status()
    notice(run, status)
    failure = run.exception(status)  # read again: what followed the cause may have come since
    if failure is None or user_fix(failure) is not None:
        return
    print("\n".join([*failure.summary().splitlines()[1:], failure.traceback.rstrip()]), file=sys.stderr, flush=True)


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
    pruned = run.meta.get("pruned")
    if isinstance(pruned, dict):  # a sweep's pruner stopped it: when and why, in its driver's words
        sweep = Path(str(pruned.get("sweep") or "")).name or "its sweep"
        print(f"[workbench] {pruned.get('why') or run.meta.get('cancelled_by') or 'pruned'} (sweep {sweep})")
    elif run.meta.get("cancelled"):
        print(f"[workbench] cancelled ({run.meta.get('cancelled_by', 'by the user')})")

