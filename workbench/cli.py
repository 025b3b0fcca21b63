"""`workbench ...` commands over the same Python API a notebook uses."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from workbench.config import JobConfig
from workbench.configtypes import ConfigError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # what follows "--" belongs to a script
    args = _parser().parse_args(argv[:cut])
    args.script_args = argv[cut + 1:]
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"workbench: {exc.filename or exc}: no such file", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="Configure, run and inspect DDP jobs.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a config (local ranks or SLURM), showing live per-rank progress")
    _config_args(run)
    run.add_argument("--nproc", type=int, help="ranks per node (dist.procs_per_node)")
    run.add_argument("--nodes", type=int, help="nodes (dist.nodes)")
    run.add_argument("--executor", choices=["local", "slurm"], help="launch.executor")
    run.add_argument("--run-dir", help="run folder (an existing one resumes from its latest checkpoint)")
    run.add_argument("--quiet", action="store_true", help="no per-step lines")
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

    export = sub.add_parser("export", help="print an equivalent sbatch script or torchrun command")
    _config_args(export)
    kind = export.add_mutually_exclusive_group(required=True)
    kind.add_argument("--sbatch", action="store_true", help="an sbatch script (one torchrun per node)")
    kind.add_argument("--torchrun", action="store_true", help="a torchrun command")
    export.set_defaults(func=cmd_export)

    launch = sub.add_parser("launch", help="launch an existing torchrun-style script: workbench launch train.py [--nproc N] -- ARGS")
    launch.add_argument("script")
    launch.add_argument("--config", help="YAML config for dist and launch settings")
    launch.add_argument("--nproc", type=int, help="ranks per node")
    launch.add_argument("--nodes", type=int, help="nodes (SLURM)")
    launch.add_argument("--executor", choices=["local", "slurm"])
    launch.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    launch.add_argument("--quiet", action="store_true")
    launch.set_defaults(func=cmd_launch)

    check = sub.add_parser("check", help="validate a config and print every problem")
    _config_args(check)
    check.set_defaults(func=cmd_check)
    return parser


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
    from workbench.launch.submit import submit

    return follow(submit(load_config(args), run_dir=args.run_dir), args.quiet)


def cmd_launch(args: argparse.Namespace) -> int:
    from workbench.launch.script import submit_script

    return follow(submit_script(args.script, args.script_args, load_config(args)), args.quiet)


def follow(run: Any, quiet: bool = False) -> int:
    """Stream a run's progress to the terminal; per-rank table and plot at the end; 1 if it failed."""
    from workbench.plots import save_run_plot

    print(f"[workbench] run folder: {run.folder}", flush=True)
    printer = ProgressPrinter(quiet=quiet)
    status = run.wait(on_poll=printer)
    printer(run)
    frame = run.metrics()
    if len(frame):
        plot = save_run_plot(frame, str(run.dir.plots / "loss.png"))
        print(f"[workbench] per-rank plot: {plot}")
        print(per_rank_table(frame).to_string())
    print(f"[workbench] {status}")
    if status.state != "finished":
        _print_failure(run)
        return 1
    return 0


class ProgressPrinter:
    """Prints new metric records as they stream in, at most one line per rank per second."""

    KNOWN = ("loss", "loss_reduced", "lr", "samples_per_s", "step_time_s", "comm_wait_s", "mem_mb")
    HIDDEN = {"rank", "step", "time", "epoch", "attempt", "data_time_s", "comm_busy_s", *KNOWN}

    def __init__(self, quiet: bool = False, every_s: float = 1.0):
        self.quiet, self.every_s = quiet, every_s
        self.last: dict[int, float] = {}
        self.started = False

    def __call__(self, run: Any) -> None:
        if not self.quiet and not self.started:
            self.started = print_start(run)
        for rec in run.poll_metrics():
            now = time.monotonic()
            if self.quiet or now - self.last.get(rec["rank"], 0) < self.every_s:
                continue
            self.last[rec["rank"]] = now
            print(f"  rank {rec['rank']} | step {rec['step']:>6} | " + format_record(rec), flush=True)


def print_start(run: Any) -> bool:
    """Print the derived numbers of rank 0's start event once it is there; returns whether it was."""
    events = run.events()
    start = events[(events["event"] == "start") & (events["rank"] == 0)] if len(events) else events
    if not len(start) or "effective_batch" not in start:
        return False
    e = start.iloc[-1]
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


def parse_world_sizes(text: str) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8]; anything else is a ConfigError naming --world-sizes."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ConfigError([f"--world-sizes: expected positive whole numbers separated by commas, got {text!r}"])
    return sizes


def cmd_export(args: argparse.Namespace) -> int:
    from workbench.launch.export import sbatch_script, torchrun_command

    cfg = load_config(args)
    print(sbatch_script(cfg, args.config) if args.sbatch else torchrun_command(cfg, args.config))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from workbench.scaling import scaling_table

    cfg = load_config(args)
    sizes = parse_world_sizes(args.world_sizes)
    table = scaling_table(cfg, sizes, rule=args.rule, dataset_size=args.dataset_size, compare_rules=args.compare)
    print(table.to_string(index=False))
    return 0


BENCH_COLUMNS = ["world_size", "samples_per_s", "speedup", "expected_speedup", "efficiency", "step_time_s",
                 "data_time_s", "compute_s", "comm_wait_s", "comm_share", "mem_mb_per_rank"]


def cmd_bench_scaling(args: argparse.Namespace) -> int:
    from workbench.plots import plot_scaling
    from workbench.scaling_bench import benchmark_scaling

    from workbench.launch.run import RunFailed

    sizes = parse_world_sizes(args.world_sizes)
    try:
        frame = benchmark_scaling(load_config(args), sizes, steps=args.steps, warmup_steps=args.warmup_steps)
    except RunFailed as exc:
        print(f"workbench: {exc}\n{exc.failure.traceback if exc.failure else ''}", file=sys.stderr)
        return 1
    print(frame[BENCH_COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    plot = Path(frame.attrs["folder"]) / "scaling.png"
    plot_scaling(frame).savefig(plot, dpi=100)
    print(f"[workbench] runs and scaling.csv: {frame.attrs['folder']}\n[workbench] scaling plot: {plot}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from workbench.launch.run import Run

    run = Run.load(args.run_dir)
    status = run.status()
    print(f"run {run.folder}: {status}")
    print(status.frame().to_string(index=False))
    frame = run.metrics()
    if len(frame):
        from workbench.analysis import format_report

        print(per_rank_table(frame).to_string())
        print(format_report(run.report()))
    if status.state == "failed":
        _print_failure(run)
    elif status.state == "finished":
        print(run.result())
    return 0 if status.state != "failed" else 1


def cmd_check(args: argparse.Namespace) -> int:
    load_config(args).check()
    print("config OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
