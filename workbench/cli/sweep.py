"""`workbench sweep CONFIG --grid train.lr=1e-3,3e-3 [--search FIELD=loguniform(A,B)] ...`,
`workbench sweep [CONFIG] --script train.py --grid args.lr=1e-3,1e-2 -- ARGS` (a script's options,
its base arguments after `--`, as `workbench launch train.py --nproc 2 -- ARGS`) and
`workbench sweep --resume FOLDER`: a sweep driven by this command, one line per trial event.  The
command owns its trials: Ctrl-C (SIGINT, SIGTERM, SIGHUP) cancels every one; killed outright, its
trials' runs stop with it (the study stays: `--resume FOLDER` queues them again)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.errors import ConfigError


def add_sweep_parser(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="search a config space with one run per trial (Optuna: grid, TPE, "
                           "pruning); needs the sweep extra")
    sweep.add_argument("config", nargs="?", help="YAML config file (the base of every trial; optional with --script)")
    sweep.add_argument("--script", metavar="SCRIPT.py", help="sweep a torchrun-style script's options, run as "
                       "workbench launch runs it: --grid args.lr=1e-3,1e-2 replaces the base arguments' --lr in "
                       "its style (--lr V, --lr=V, or Hydra's lr=V), else adds --lr=VALUE (argparse, click, "
                       "nanoGPT's configurator), or ++lr=VALUE for a Hydra app (base arguments all key=value, or "
                       "a dotted name: args.trainer.lr); its base arguments follow --, e.g. --script train.py "
                       "--grid args.lr=1e-3,1e-2 -- --epochs 1")
    sweep.add_argument("-m", dest="module", metavar="MODULE", help="sweep a module's options instead, run as "
                       "python -m runs it (as workbench launch -m)")
    sweep.add_argument("--nproc", type=int, help="ranks per node (dist.procs_per_node)")
    sweep.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                       help="a field's values, e.g. --grid train.lr=1e-3,3e-3 (repeatable: every combination)")
    sweep.add_argument("--search", action="append", default=[], metavar="FIELD=DIST(A,B)",
                       help="a field sampled from loguniform(A,B), uniform(A,B), int_range(A,B) or choice(X,Y,...)")
    sweep.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override a field of the base config (repeatable)")
    sweep.add_argument("--trials", type=int, help="how many trials (default: every grid point)")
    sweep.add_argument("--parallel", type=int, default=1, help="trials at once (default 1)")
    sweep.add_argument("--metric", default="val_loss", help="the metric to optimise and prune on (default val_loss)")
    sweep.add_argument("--direction", choices=["minimize", "maximize"], default="minimize")
    sweep.add_argument("--prune", default=None, metavar="PRUNER",
                       help="stop losing trials early: median, percentile, hyperband or none.  Default: none "
                       "for a --grid (every point runs to its end), median for a --search (a trial worse than "
                       "the median of the finished trials at the same step stops, once 5 have finished)")
    sweep.add_argument("--executor", dest="sweep_executor", choices=["local", "slurm", "pool"], default=None,
                       help="where trials run: fresh local ranks, SLURM jobs, or one warm pool (one after another)")
    sweep.add_argument("--name", help="the sweep's name (its folder: <run_root>/sweep-<name>-<time>)")
    sweep.add_argument("--resume", metavar="FOLDER", help="go on with the sweep in FOLDER (finished trials stay)")
    sweep.add_argument("--trust", action="store_true",
                       help="with --resume: read the sweep's task (payload.pkl, code) even from a folder that is "
                       "not your own and private (another user's, or writable by others)")
    sweep.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.cli.owner import Interrupted, check_stop, stop_signals_interrupt

    pool = None
    with stop_signals_interrupt():
        try:
            sweep, pool = _start(args)
            print(f"[sweep] folder: {sweep.folder}\n[sweep] pruner: {sweep.pruner}", flush=True)
            sweep.wait(on_poll=lambda _s: check_stop())
        except Interrupted as stop:
            if "sweep" in locals():
                _say(f"{stop.args[0]}: cancelling every trial (checkpoints and metrics stay)")
                sweep.cancel()
            _close(pool)
            return 128 + stop.signum
        _close(pool)
    frame = sweep.frame()
    print(frame.drop(columns=["run", "note"]).to_string(index=False), flush=True)
    for number, state, note in zip(frame["number"], frame["state"], frame["note"]):
        if isinstance(note, str) and note:  # when and why a trial was pruned, why one failed
            print(f"[sweep] trial {number} {note}" if note.startswith(state) else
                  f"[sweep] trial {number} {state}: {note}", flush=True)
    best = sweep.best
    if best is None:
        print("[sweep] no trial finished", flush=True)
        return 1
    print(f"[sweep] best: trial {best.number}, {sweep.metric} {best.value:.4g}: {best.run.folder}", flush=True)
    return 0


def _start(args: argparse.Namespace) -> tuple[Any, Any]:
    from workbench.sweeps.driver import Sweep, sweep
    from workbench.sweeps.payload import Script
    from workbench.sweeps.space import parse_assignments

    script_args = _script_args(args)
    if args.resume:
        return Sweep.load(args.resume, background=False, stop_with_caller=True, on_event=_line, trust=args.trust), None
    if not args.config and not args.script and not args.module:
        raise ConfigError(["sweep: give the base config (workbench sweep CONFIG.yaml --grid ...), a script "
                           "(--script train.py --grid args.lr=...) or --resume FOLDER"])
    space = parse_assignments(args.grid, args.search)
    if not space:
        raise ConfigError(["--grid: give at least one swept field, e.g. --grid train.lr=1e-3,3e-3 or "
                           "--search train.lr=loguniform(1e-4,1e-2)"])
    from workbench.cli.commands import load_config

    cfg = load_config(args)  # the file (or the defaults, for a script) with --set and --nproc
    executor = args.sweep_executor
    pool = None
    if executor == "pool":
        from workbench.launch.pool import Pool

        pool = Pool(cfg, stop_with_caller=True)
    try:
        started = sweep(cfg, space, trials=args.trials, parallel=args.parallel, metric=args.metric,
                        direction=args.direction, pruner=args.prune, pool=pool,
                        executor=None if executor in (None, "pool") else executor, name=args.name,
                        payload=Script(args.script, *script_args, module=args.module)
                        if args.script or args.module or script_args else None, background=False,
                        stop_with_caller=True, on_event=_line)
    except BaseException:
        _close(pool)
        raise
    return started, pool


def _script_args(args: argparse.Namespace) -> list[str]:
    """What follows `--`: the swept script's base arguments."""
    given = list(getattr(args, "script_args", None) or [])
    if given and args.resume:
        raise ConfigError([f"-- {' '.join(given)}: a resumed sweep runs its script with the arguments it was made "
                           "with (its sweep.json); leave out what follows --"])
    if given and not args.script and not args.module:
        raise ConfigError([f"-- {' '.join(given)}: arguments after -- are a swept script's; give the script "
                           "(--script train.py), or leave them out"])
    return given


def _close(pool: Any) -> None:
    if pool is not None:
        pool.close()


def _line(text: str) -> None:
    print(f"[sweep] {text}", flush=True)


def _say(text: str) -> None:
    print(f"[workbench] {text}", file=sys.stderr, flush=True)
