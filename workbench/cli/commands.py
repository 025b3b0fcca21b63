"""One function per `workbench` command, over the same Python API a notebook uses."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from workbench.cli.printing import (
    _print_failure,
    follow,
    per_rank_table,
    print_history,
    summary_line,
    table_for_people,
)
from workbench.config.scaling import parse_world_sizes
from workbench.config.sections import JobConfig, flatten
from workbench.errors import ConfigError
from workbench.runfolder.layout import ScalingBenchDir

BENCH_COLUMNS = ["world_size", "samples_per_s", "speedup", "expected_speedup", "efficiency", "step_time_s",
                 "data_time_s", "compute_s", "comm_wait_s", "comm_share", "mem_mb_per_rank"]


def load_config(args: argparse.Namespace) -> JobConfig:
    """The config file with --set and the shortcut flags (--executor, --nodes, --nproc) applied together,
    then validated once: `--executor slurm --set dist.nodes=2` is judged as the SLURM job it asks for."""
    overrides = config_overrides(args)
    if args.config:
        return JobConfig.from_yaml(Path(args.config), overrides)
    return JobConfig().with_overrides(overrides)


def config_overrides(args: argparse.Namespace) -> list[str]:
    """--set assignments, then the shortcut flags as assignments (a flag wins over a --set of its field)."""
    shortcuts = {"launch.executor": getattr(args, "executor", None), "dist.nodes": getattr(args, "nodes", None),
                 "dist.procs_per_node": getattr(args, "nproc", None)}
    return [*getattr(args, "set", []), *(f"{k}={v}" for k, v in shortcuts.items() if v is not None)]


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
    from workbench.cli.owner import print_detached, stop_signals_interrupt
    from workbench.errors import SubmitError

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
    from workbench.cli.owner import stop_signals_interrupt
    from workbench.launch.run import Run

    with stop_signals_interrupt():
        return follow(Run.load(args.run_dir), args.quiet, ranks=getattr(args, "ranks", None))


def cmd_pools(args: argparse.Namespace) -> int:
    import datetime

    from workbench.errors import ConfigError
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
    run.cancel(by=f"workbench cancel (pid {os.getpid()})")
    if run.not_signalled:  # said in one line (a warning): nothing of it was ours to stop
        return 1
    status = run.status()
    print(f"[workbench] run {run.folder}: {status}")
    return 0 if status.done else 1


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
    from workbench.config.scaling import reference_note, scaling_table

    cfg = load_config(args)
    sizes = parse_world_sizes(args.world_sizes, "--world-sizes")
    table = scaling_table(cfg, sizes, rule=args.rule, dataset_size=args.dataset_size, compare_rules=args.compare)
    shown = table.assign(  # for people: no 1.000000, None or False
        selected=table["selected"].map({True: "yes", False: "no"}),
        steps_per_epoch=table["steps_per_epoch"].map(lambda v: "—" if v is None or v != v else str(int(v))))
    print(table_for_people(shown, index=False))
    print(reference_note(cfg))
    if table["steps_per_epoch"].isna().all():
        print("steps_per_epoch: — (the dataset's size is not in the config: set task.train_samples or "
              "--dataset-size N; --plan counts the factory's own dataset)")
    if args.plan:
        _print_plan(cfg, sizes, args.device_memory_gb)
    return 0


PLAN_SHOWN = ["world_size", "micro_batch_size", "params_mb", "grads_mb", "optimizer_mb", "activations_mb", "peak_mb",
              "device_memory_mb", "fits", "max_micro_batch", "step_s", "samples_per_s", "epoch_s"]


def _print_plan(cfg: Any, sizes: list[int], device_memory_gb: float | None) -> None:
    from workbench.planning.plan import fit_text, plan

    frame = plan(cfg, world_sizes=sizes, device_memory_gb=device_memory_gb)
    shown = frame[PLAN_SHOWN].copy()
    for column in ("params_mb", "grads_mb", "optimizer_mb", "activations_mb", "peak_mb", "device_memory_mb"):
        shown[column] = shown[column].map(lambda v: "—" if v != v else f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
    shown["fits"] = shown["fits"].map({True: "yes", False: "NO"}).fillna("—")
    for column in ("step_s", "samples_per_s", "epoch_s"):
        shown[column] = shown[column].map(lambda v: "—" if v is None or v != v else f"{v:.4g}")
    print("\nplan (per rank; MiB):")
    print(table_for_people(shown, index=False))
    for line in fit_text(frame):
        print(f"does not fit: {line}")
    for note in frame.attrs["notes"]:
        print(note)


def cmd_bench_scaling(args: argparse.Namespace) -> int:
    from workbench.errors import RunFailed
    from workbench.launch.scaling_bench import benchmark_scaling
    from workbench.results.plots import plot_scaling, save_figure

    sizes = parse_world_sizes(args.world_sizes, "--world-sizes")
    try:
        frame = benchmark_scaling(load_config(args), sizes, steps=args.steps, warmup_steps=args.warmup_steps)
    except RunFailed as exc:
        print(f"workbench: {exc}\n{exc.failure.traceback if exc.failure else ''}", file=sys.stderr)
        return 1
    print(frame[BENCH_COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    plot = ScalingBenchDir(frame.attrs["folder"]).plot
    save_figure(plot_scaling(frame), plot)
    print(f"[workbench] runs and scaling.csv: {frame.attrs['folder']}\n[workbench] scaling plot: {plot}")
    return 0


RUNS_SHOWN = ["name", "status", "start", "duration_s", "world_size", "effective_batch", "base_lr", "lr", "steps",
              "last_loss", "best_loss"]


def cmd_runs(args: argparse.Namespace) -> int:
    from workbench.launch.history import runs

    if args.root is not None and not Path(args.root).is_dir():
        raise ConfigError([f"runs: {args.root} is not a folder; give a run root, e.g. workbench runs runs/"])
    frame = runs(args.root)
    if not len(frame):
        print(f"[workbench] no runs under {args.root or 'the run root (WORKBENCH_RUN_ROOT, else runs/)'}")
        return 0
    shown = frame[[c for c in RUNS_SHOWN if c in frame]].rename(columns={"base_lr": "base_lr", "lr": "lr_used"})
    if args.last:
        shown = shown.tail(args.last)
    shown = shown.assign(start=shown["start"].map(lambda v: "" if v != v or v is None else f"{v:%Y-%m-%d %H:%M}"))
    print(table_for_people(shown, index=False))
    print(f"[workbench] {len(frame)} run(s); lr_used: the peak the job logged, or train.lr scaled to its ranks; "
          "base_lr: train.lr as configured.  workbench show FOLDER for one")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from workbench.launch.run import Run

    run = Run.load(args.run_dir)
    if args.plan:
        print("[workbench] predicting the run's peak memory and step time (workbench.plan) ...", flush=True)
        try:
            run.plan()  # kept in the run folder: the report below shows it
        except Exception as exc:  # noqa: BLE001 - the rest of the run still shows; why there is no plan is one line
            print(f"plan: not predicted ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    status = run.status()
    print(f"run {run.folder}: {status.progress_line()}")
    print(table_for_people(status.frame(), index=False))
    frame = run.metrics()
    if len(frame):
        from workbench.results.analysis import format_report

        print(table_for_people(per_rank_table(frame)))
        print(format_report(run.report()))
    print_history(run)
    if status.state == "failed":
        _print_failure(run)
    elif status.state == "finished":
        print(summary_line(run.result()))
    return 0  # it showed the run, whatever the run's state (see the exit codes in `workbench --help`)


def cmd_config(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    if args.where:
        print(field_uses(args.where))
    elif args.docs:
        flat = flatten(cfg.to_dict())
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
    root = Path(__file__).resolve().parents[1]  # the workbench package
    skip = {root / "config" / "sections.py", *(root / "cli").glob("*.py")}  # where fields are declared and named
    hits = [f"  {file.relative_to(root.parent)}:{n}: {line.strip()}"
            for file in sorted(root.rglob("*.py")) if file not in skip
            for n, line in enumerate(file.read_text().splitlines(), 1) if pattern.search(line)]
    return "\n".join([f"{path}: {docs[path]}", "read at:", *(hits or ["  (nowhere but the config itself)"])])


def cmd_check(args: argparse.Namespace) -> int:
    """Every problem at once; a factory named as package.module:factory is imported (its code runs) and
    bound to task.options, as submit does."""
    from workbench.config.tasknames import BUILTINS
    from workbench.launch.submit import model_problems, task_problems

    cfg = load_config(args)
    problems = cfg.problems()
    if not any(p.startswith("task.name:") for p in problems):
        if cfg.task.name not in BUILTINS:
            print(f"[workbench] importing {cfg.task.name.partition(':')[0]} to check task.name "
                  "(this runs the module's code)", flush=True)
        problems += task_problems(cfg)
        problems += [] if problems else model_problems(cfg)
    module = cfg.task.name.partition(":")[0].split(".")[0]
    if cfg.task.name not in BUILTINS and module in {*sys.stdlib_module_names, "builtins"} and not any(
            p.startswith("task.name:") for p in problems):  # it is there, but it is not a task factory
        print(f"workbench: warning: task.name: {cfg.task.name} is a function of Python's standard library, not a "
              "task factory; name your own (package.module:factory) or a built-in task", file=sys.stderr, flush=True)
    if not problems and not args.no_plan:
        problems += _fit_problems(cfg, args.device_memory_gb)
    if problems:
        raise ConfigError(problems)
    print("config OK")
    return 0


def _fit_problems(cfg: Any, device_memory_gb: float | None) -> list[str]:
    """Whether a rank's training step fits its device (workbench.plan's memory, traced on fake tensors:
    no step is run): a problem line with the ways out when it does not; what was found is printed."""
    from workbench.config.devices import visible_gpu_count
    from workbench.config.scaling import too_small_message
    from workbench.planning.plan import HEADROOM, fit_text, plan

    gpu_job = cfg.launch.executor == "slurm" and cfg.launch.slurm.gpus_per_node > 0
    here = "cuda" if visible_gpu_count() else "cpu"
    device = "cuda" if gpu_job or here == "cuda" else "cpu"
    if device == "cuda" and here == "cpu" and not device_memory_gb:
        frame = plan(cfg, world_sizes=(cfg.world_size,), probe=False, device="cuda", device_memory_gb=1.0)
        if frame["steps_per_epoch"].iloc[0] == 0:
            return [too_small_message(cfg, cfg.world_size, int(frame.attrs["train_samples"]))]
        peak = frame["peak_mb"].iloc[0]
        if peak == peak:
            print(f"memory: {peak:,.1f} MiB a rank at train.micro_batch_size {cfg.train.micro_batch_size} (traced); "
                  "give --device-memory-gb to check it fits the job's GPUs")
        return []
    frame = plan(cfg, world_sizes=(cfg.world_size,), probe=False, device=device, device_memory_gb=device_memory_gb)
    row = frame.iloc[0]
    if row["steps_per_epoch"] == 0:  # the factory's own dataset is smaller than one optimizer step
        return [too_small_message(cfg, cfg.world_size, int(frame.attrs["train_samples"]))]
    if row["fits"] is None or row["fits"] != row["fits"]:
        print(f"memory: not traced ({frame.attrs['notes'][0].removeprefix('memory: ')})")
        return []
    if row["fits"]:
        print(f"memory: {row['peak_mb']:,.1f} MiB a rank at train.micro_batch_size {cfg.train.micro_batch_size} "
              f"(traced), within {HEADROOM:g} of {row['device_memory_mb']:,.0f} MiB "
              f"({'the GPU' if device == 'cuda' else 'this machine shared by a node of ranks'}); "
              f"up to micro-batch {int(row['max_micro_batch']):,} fits")
        return []
    return [f"train.micro_batch_size: does not fit: {line}" for line in fit_text(frame)]

