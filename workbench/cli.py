"""`workbench ...` commands over the same Python API a notebook uses."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.config import JobConfig
from workbench.configtypes import ConfigError
from workbench.scaling import parse_world_sizes


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        own, script_args = split_script_args(argv)
    except ConfigError as exc:
        parser.error(exc.problems[0])
    args = parser.parse_args(own)
    args.script_args = script_args
    with _warnings_as_lines():
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # the reader went away (`workbench config --docs | head`): not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except Exception as exc:  # noqa: BLE001 - every exit path prints a line; see user_error
            return report_error(exc)


def report_error(exc: BaseException) -> int:
    """A user error (a ConfigError: bad config, config file, run folder; an OSError: a path, a full
    disk) prints one line per problem, naming the field or file and the fix, and gives 2.  Anything
    else is a bug in workbench: its traceback, and 1."""
    lines = user_error(exc)
    if lines is None:
        import traceback

        traceback.print_exception(exc)
        print("workbench: this is a bug in workbench (traceback above); please report it", file=sys.stderr)
        return 1
    for line in lines:
        print(f"workbench: {line}", file=sys.stderr)
    return 2


def user_error(exc: BaseException) -> list[str] | None:
    """The lines that tell the user what is wrong and how to fix it; None when `exc` is not theirs."""
    if isinstance(exc, ConfigError):
        return exc.problems
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or str(exc)
        fix = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (disk quota)",
               errno.EACCES: "check its permissions", errno.EROFS: "the disk is read-only; use another folder",
               errno.ENOENT: "check the path"}.get(exc.errno or 0, "check the path")
        return [f"{where}{what}; {fix}"]
    return None


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Warnings (a damaged line skipped in a run folder) print as "workbench: warning: ...", once each."""
    import warnings

    shown = warnings.showwarning

    def one_line(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        print(f"workbench: warning: {message}", file=sys.stderr)

    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = shown


def _parser() -> argparse.ArgumentParser:
    from workbench import __version__

    parser = argparse.ArgumentParser(prog="workbench", description="Configure, run and inspect DDP jobs.")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a config (local ranks or SLURM), showing live per-rank progress")
    _config_args(run)
    run.add_argument("--nproc", type=int, help="ranks per node (dist.procs_per_node)")
    run.add_argument("--nodes", type=int, help="nodes (dist.nodes)")
    run.add_argument("--executor", choices=["local", "slurm"], help="launch.executor")
    run.add_argument("--run-dir", help="run folder (an existing one resumes from its latest checkpoint)")
    run.add_argument("--quiet", action="store_true", help="no per-step lines and no rank output")
    run.add_argument("--ranks", help="whose output to show: all, none or ranks such as 0,3 (default: every rank "
                     "up to 8, beyond that rank 0 and every rank's errors)")
    run.add_argument("--from-scratch", action="store_true",
                     help="with --run-dir of an earlier run: start over, its checkpoints set aside")
    _detach_arg(run)
    run.set_defaults(func=cmd_run)

    table = sub.add_parser("table", help="print the scaling table (effective batch, lr, warmup, steps/epoch)")
    _config_args(table)
    table.add_argument("--world-sizes", default="1,2,4,8", help="comma-separated, default 1,2,4,8")
    table.add_argument("--rule", choices=["none", "linear", "sqrt", "capped"], help="scaling.rule")
    table.add_argument("--compare", action="store_true", help="every rule side by side")
    table.add_argument("--dataset-size", type=int, help="training samples (default: task.train_samples)")
    table.set_defaults(func=cmd_table)

    bench = sub.add_parser("bench-scaling", help="measure throughput, speedup and efficiency with short real "
                           "runs at several world sizes")
    _config_args(bench)
    bench.add_argument("--world-sizes", default="1,2", help="comma-separated, default 1,2")
    bench.add_argument("--steps", type=int, default=30, help="steps per run, default 30")
    bench.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of the medians, default 5")
    bench.add_argument("--executor", choices=["local", "slurm"], help="launch.executor")
    bench.set_defaults(func=cmd_bench_scaling)

    show = sub.add_parser("show", help="print a run's status, summary and failure")
    show.add_argument("run_dir")
    show.set_defaults(func=cmd_show)

    export = sub.add_parser("export", help="print an equivalent sbatch script or torchrun command (CONFIG), or "
                            "export a run's metrics to TensorBoard, CSV or Parquet (RUN_DIR)")
    _config_args(export)
    kind = export.add_mutually_exclusive_group(required=True)
    kind.add_argument("--sbatch", action="store_true", help="an sbatch script (one torchrun per node)")
    kind.add_argument("--torchrun", action="store_true", help="a torchrun command")
    kind.add_argument("--tensorboard", metavar="DIR", help="RUN_DIR's metrics as TensorBoard event files in DIR")
    kind.add_argument("--metrics", metavar="FILE", help="RUN_DIR's metrics as FILE (.csv or .parquet)")
    export.set_defaults(func=cmd_export)

    launch = sub.add_parser("launch", help="launch an existing torchrun-style script, as torchrun does: "
                            "workbench launch [--nproc N] train.py ARGS, or -m package.module ARGS")
    launch.add_argument("script", nargs="?", help="the script; what follows it goes to the script")
    launch.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    for flag, kwargs in LAUNCH_OPTIONS.items():
        launch.add_argument(flag, **kwargs)
    launch.set_defaults(func=cmd_launch)

    follow = sub.add_parser("follow", help="follow a running run's progress (Ctrl-C stops following, not the run)")
    follow.add_argument("run_dir")
    follow.add_argument("--quiet", action="store_true")
    follow.set_defaults(func=cmd_follow)

    cancel = sub.add_parser("cancel", help="stop every rank of a run (checkpoints and metrics stay)")
    cancel.add_argument("run_dir")
    cancel.set_defaults(func=cmd_cancel)

    pools = sub.add_parser("pools", help="list the warm pools (workbench.Pool) under a run root, or close one")
    pools.add_argument("--run-root", default=None, help="where the pools are (default: launch.run_root's default)")
    pools.add_argument("--all", action="store_true", help="closed pools too")
    pools.add_argument("--close", metavar="NAME", help="close this pool: end its ranks, release its allocation")
    pools.set_defaults(func=cmd_pools)

    check = sub.add_parser("check", help="validate a config and print every problem")
    _config_args(check)
    check.set_defaults(func=cmd_check)

    config = sub.add_parser("config", help="print the resolved config (defaults, file and --set applied), "
                            "what each field means, or where the code reads a field")
    config.add_argument("config", nargs="?", help="YAML config file (default: the built-in defaults)")
    config.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a field, e.g. --set train.lr=3e-4 (repeatable)")
    shown = config.add_mutually_exclusive_group()
    shown.add_argument("--docs", action="store_true", help="every field with its value and what it means")
    shown.add_argument("--where", metavar="SECTION.FIELD", help="what the field means and the lines of "
                       "workbench's code that read it")
    config.set_defaults(func=cmd_config)
    return parser


LAUNCH_OPTIONS: dict[str, dict[str, Any]] = {
    "--config": {"help": "YAML config for dist and launch settings"},
    "--nproc": {"type": int, "help": "ranks per node"},
    "--nodes": {"type": int, "help": "nodes (SLURM)"},
    "--executor": {"choices": ["local", "slurm"]},
    "--set": {"action": "append", "default": [], "metavar": "SECTION.FIELD=VALUE"},
    "--cwd": {"help": "the ranks' working folder (default: this one)"},
    "--env": {"action": "append", "default": [], "metavar": "NAME=VALUE", "help": "an environment variable for "
              "the ranks (repeatable)"},
    "--quiet": {"action": "store_true", "help": "no per-step lines and no rank output"},
    "--detach": {"action": "store_true", "help": "start the run and return: it goes on without this command "
                 "(workbench follow / cancel RUN_DIR later); without it, stopping this command (Ctrl-C, "
                 "SIGTERM, SIGHUP, killed) cancels the run"},
    "--ranks": {"help": "whose output to show: all, none or ranks such as 0,3 (default: every rank up to 8, "
                "beyond that rank 0 and every rank's errors)"},
}


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(workbench's own arguments, the script's) for `workbench launch`, torchrun's way: what comes
    after the script (or -m MODULE) is the script's.  A `--` ends workbench's options anywhere (the
    older `launch train.py --nproc 2 -- ARGS` form); one of workbench's options after the script
    without a `--` is ambiguous and says how to write it."""
    if not argv or argv[0] != "launch":
        cut = argv.index("--") if "--" in argv else len(argv)
        return argv[:cut], argv[cut + 1:]
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1:]
        if token == "-m":
            i += 2
            break
        if not token.startswith("-"):
            i += 1
            break
        takes_value = token in LAUNCH_OPTIONS and LAUNCH_OPTIONS[token].get("action") != "store_true"
        i += 2 if takes_value else 1
    rest = argv[i:]
    if "--" in rest:  # workbench options after the script, then the script's
        cut = rest.index("--")
        return argv[:i] + rest[:cut], rest[cut + 1:]
    clash = [t for t in rest if t.split("=")[0] in LAUNCH_OPTIONS]
    if clash:
        raise ConfigError([f"{clash[0]} comes after the script, so it would go to the script: put workbench's options "
                           f"before the script (workbench launch {clash[0]} ... train.py ARGS), or end them with -- "
                           f"(workbench launch train.py {clash[0]} ... -- ARGS)"])
    return argv[:i], rest


def _detach_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--detach", **LAUNCH_OPTIONS["--detach"])


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a field, e.g. --set train.lr=3e-4 (repeatable)")


def load_config(args: argparse.Namespace) -> JobConfig:
    cfg = (JobConfig.from_yaml(Path(args.config)) if args.config else JobConfig()).with_overrides(args.set)
    extra = {"dist.procs_per_node": getattr(args, "nproc", None), "dist.nodes": getattr(args, "nodes", None),
             "launch.executor": getattr(args, "executor", None)}
    sets = [f"{k}={v}" for k, v in extra.items() if v is not None]
    return cfg.with_overrides(sets) if sets else cfg


def cmd_run(args: argparse.Namespace) -> int:
    from workbench.launch.output import shown_streams
    from workbench.launch.submit import submit

    cfg = load_config(args)
    shown_streams(cfg.world_size, args.ranks)  # a bad --ranks fails before anything runs
    return _start_owned(args, lambda: submit(cfg, run_dir=args.run_dir, from_scratch=args.from_scratch,
                                             stop_with_caller=not args.detach))


def cmd_launch(args: argparse.Namespace) -> int:
    from workbench.launch.submit import submit_script

    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError([f"--env {item!r}: write NAME=VALUE, e.g. --env NCCL_DEBUG=INFO"])
        env[name] = value
    from workbench.launch.output import shown_streams

    cfg = load_config(args)
    shown_streams(cfg.world_size, args.ranks)  # a bad --ranks fails before anything runs
    return _start_owned(args, lambda: submit_script(args.script, args.script_args, cfg, module=args.module,
                                                    cwd=args.cwd, env=env, stop_with_caller=not args.detach))


def _start_owned(args: argparse.Namespace, start: Any) -> int:
    """Submit, then follow the run as its owner (stopping this command cancels it), or detach."""
    from workbench.launch.submit import SubmitError
    from workbench.owner import print_detached, stop_signals_interrupt

    with stop_signals_interrupt():
        try:
            run = start()
        except SubmitError as exc:
            print(f"workbench: {exc}", file=sys.stderr)
            return 2
        if args.detach:
            print_detached(run)  # a stop signal that came while submitting: raised on leaving the block
            return 0
        return follow(run, args.quiet, owned=True, ranks=args.ranks)


def cmd_follow(args: argparse.Namespace) -> int:
    from workbench.launch.run import Run
    from workbench.owner import stop_signals_interrupt

    with stop_signals_interrupt():
        return follow(Run.load(args.run_dir), args.quiet, ranks=getattr(args, "ranks", None))


def cmd_pools(args: argparse.Namespace) -> int:
    import datetime

    from workbench.configtypes import ConfigError
    from workbench.launch.pool import close_pool, pools

    rows = pools(args.run_root, live_only=not args.all and not args.close)
    if args.close:
        found = [r for r in rows if r["name"] == args.close]
        if not found:
            raise ConfigError([f"--close {args.close}: no pool of that name under the run root; "
                               f"`workbench pools --all` lists them"])
        close_pool(found[0]["folder"])
        print(f"[workbench] pool {args.close} closed")
        return 0
    if not rows:
        print("[workbench] no open pools" + ("" if args.all else " (--all lists closed ones too)"))
        return 0
    print(f"{'name':36s} {'where':14s} {'ranks':>5s} {'state':7s} {'jobs':>4s}  idle since")
    for r in rows:
        where = f"{r['executor']} {r['job_id'] or ''}".strip()
        since = datetime.datetime.fromtimestamp(float(r["idle_since"] or 0)).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r['name']:36s} {where:14s} {r['world_size'] or '?':>5} {r['state']:7s} {r['jobs']:>4d}  {since}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from workbench.launch.run import Run

    run = Run.load(args.run_dir)
    before = run.status()
    if before.done and run.job_done():
        print(f"[workbench] run {run.folder} already ended: {before}")
        return 0
    run.cancel()
    status = run.status()
    print(f"[workbench] run {run.folder}: {status}")
    return 0 if status.done else 1


def follow(run: Any, quiet: bool = False, owned: bool = False, ranks: str | None = None) -> int:
    """Stream a run's progress to the terminal; per-rank table and plot at the end; 1 if it failed.

    An owner (`workbench run`, `workbench launch`) cancels the run when stopped by a signal or when
    this loop fails; a follower (`workbench follow`) only stops following."""
    from workbench.owner import Interrupted, cancel_owned, check_stop

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
    import contextlib

    from workbench.plots import save_run_plot

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


def cmd_export(args: argparse.Namespace) -> int:
    from workbench.launch.export import sbatch_script, torchrun_command

    if args.tensorboard or args.metrics:
        from workbench.launch.run import Run

        run = Run.load(args.config)  # here the positional argument is a run folder
        done = run.to_tensorboard(args.tensorboard) if args.tensorboard else run.export_metrics(args.metrics)
        print(f"[workbench] wrote {done}" + (f" (tensorboard --logdir {done})" if args.tensorboard else ""))
        return 0
    cfg = load_config(args)
    print(sbatch_script(cfg, args.config) if args.sbatch else torchrun_command(cfg, args.config))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from workbench.scaling import scaling_table

    cfg = load_config(args)
    sizes = parse_world_sizes(args.world_sizes, "--world-sizes")
    table = scaling_table(cfg, sizes, rule=args.rule, dataset_size=args.dataset_size, compare_rules=args.compare)
    print(table.to_string(index=False))
    return 0


BENCH_COLUMNS = ["world_size", "samples_per_s", "speedup", "expected_speedup", "efficiency", "step_time_s",
                 "data_time_s", "compute_s", "comm_wait_s", "comm_share", "mem_mb_per_rank"]


def cmd_bench_scaling(args: argparse.Namespace) -> int:
    from workbench.launch.run import RunFailed
    from workbench.plots import plot_scaling, save_figure
    from workbench.scaling_bench import benchmark_scaling

    sizes = parse_world_sizes(args.world_sizes, "--world-sizes")
    try:
        frame = benchmark_scaling(load_config(args), sizes, steps=args.steps, warmup_steps=args.warmup_steps)
    except RunFailed as exc:
        print(f"workbench: {exc}\n{exc.failure.traceback if exc.failure else ''}", file=sys.stderr)
        return 1
    print(frame[BENCH_COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    plot = Path(frame.attrs["folder"]) / "scaling.png"
    save_figure(plot_scaling(frame), plot)
    print(f"[workbench] runs and scaling.csv: {frame.attrs['folder']}\n[workbench] scaling plot: {plot}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from workbench.launch.run import Run

    run = Run.load(args.run_dir)
    status = run.status()
    print(f"run {run.folder}: {status.progress_line()}")
    print(status.frame().to_string(index=False))
    frame = run.metrics()
    if len(frame):
        from workbench.analysis import format_report

        print(per_rank_table(frame).to_string())
        print(format_report(run.report()))
    print_history(run)
    if status.state == "failed":
        _print_failure(run)
    elif status.state == "finished":
        print(run.result())
    return 0 if status.state != "failed" else 1


def cmd_config(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    if args.where:
        print(field_uses(args.where))
    elif args.docs:
        flat = _flatten(cfg.to_dict())
        for path, doc in JobConfig.docs().items():
            if path in flat:
                print(f"{path} = {flat[path]!r}\n    {doc}")
    else:
        print(cfg.to_yaml(), end="")
    return 0


def field_uses(path: str) -> str:
    """What a config field means and where workbench's own code reads it (file:line: code)."""
    import re

    docs = JobConfig.docs()
    if path not in docs or path in {p.rsplit(".", 1)[0] for p in docs if "." in p}:
        raise ConfigError([f"--where: {path!r} is not a config field; `workbench config --docs` lists them"])
    leaf = path.rsplit(".", 1)[-1]
    pattern = re.compile(rf"\.{leaf}\b|[\"']{leaf}[\"']|\b{leaf}=")
    root = Path(__file__).resolve().parent
    hits = [f"  {file.relative_to(root.parent)}:{n}: {line.strip()}"
            for file in sorted(root.rglob("*.py")) if file.name not in ("config.py", "cli.py")
            for n, line in enumerate(file.read_text().splitlines(), 1) if pattern.search(line)]
    return "\n".join([f"{path}: {docs[path]}", "read at:", *(hits or ["  (nowhere but the config itself)"])])


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train.lr": 0.001, ...}: every field's value, sections opened (option dicts kept whole)."""
    sections = {path.rsplit(".", 1)[0] for path in JobConfig.docs() if "." in path}
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path in sections:
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def cmd_check(args: argparse.Namespace) -> int:
    load_config(args).check()
    print("config OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
