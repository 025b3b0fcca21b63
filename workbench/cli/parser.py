"""The `workbench` command line: one subcommand per command, each bound to its function in
`workbench.cli.commands`."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli.commands import (
    cmd_bench_scaling,
    cmd_cancel,
    cmd_check,
    cmd_config,
    cmd_export,
    cmd_follow,
    cmd_launch,
    cmd_pools,
    cmd_run,
    cmd_runs,
    cmd_show,
    cmd_table,
)
from workbench.cli.sweep import add_sweep_parser
from workbench.errors import ConfigError

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


EXIT_CODES = ("exit status: 0 the command did what it was asked (`show` of a failed run too; `follow` of a "
              "trial a sweep pruned); 1 the job that `run`, `launch`, `follow` or `bench-scaling` ran or followed "
              "failed or was cancelled, or no trial of a `sweep` finished; 2 a problem with your input or "
              "environment, said in one `workbench:` line; 128+N stopped by signal N")


def _parser() -> argparse.ArgumentParser:
    from workbench import __version__

    parser = argparse.ArgumentParser(prog="workbench", description="Configure, run and inspect DDP jobs.",
                                     epilog=EXIT_CODES)
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
    table.add_argument("--plan", action="store_true", help="also each rank's memory (traced on fake tensors), "
                       "whether it fits, the largest micro-batch that does, and the predicted speed (workbench.plan)")
    table.add_argument("--device-memory-gb", type=float, help="with --plan: the memory of the device the job will "
                       "have (default: this machine's GPU, or its memory shared by a node's ranks)")
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
    show.add_argument("--plan", action="store_true", help="also predict the run's peak memory and step time "
                      "(workbench.plan: a few seconds to a minute, kept in the run folder) and check each rank "
                      "against them (run.plan())")
    show.set_defaults(func=cmd_show)

    listing = sub.add_parser("runs", help="list the runs under a folder, newest last (workbench.runs(): status, "
                             "ranks, batch, lr, losses)")
    listing.add_argument("root", nargs="?", help="the run root (default: WORKBENCH_RUN_ROOT, else runs/)")
    listing.add_argument("--last", type=int, default=20, help="show the last N runs (default 20; 0: all)")
    listing.set_defaults(func=cmd_runs)

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
    check.add_argument("--device-memory-gb", type=float, help="the memory of each rank's device (default: this "
                       "machine's GPU, or its memory shared by a node's ranks); a rank's step that does not fit "
                       "within 0.85 of it is a problem, with the ways out")
    check.add_argument("--no-plan", action="store_true", help="skip the memory check (it traces the model on "
                       "fake tensors: a few seconds)")
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

    add_sweep_parser(sub)
    return parser


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

