"""Submitting: validate, create the run folder, hand one rank process per rank to submitit, return a Run.

`submit` trains the engine on every rank; `submit_script` runs an existing torchrun-style script.
Both go through one pipeline (`_start`), so both get the same checks, run folder and Run handle."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import JobConfig
from workbench.configtypes import ConfigError
from workbench.engine.entry import FnEntry, RankEntry, ScriptEntry
from workbench.engine.rendezvous import RankContract
from workbench.engine.script import FnJob, ScriptJob
from workbench.engine.tasks import factory_label
from workbench.launch.executors import make_executor
from workbench.launch.run import Run
from workbench.private import private_umask
from workbench.rundir import RunDir, default_run_dir, safe_name


def submit(cfg: JobConfig, task: Callable[..., Any] | None = None, run_dir: str | Path | None = None) -> Run:
    """Start `cfg` on its executor (local or SLURM) and return a live Run handle.

    `task` is an optional task factory (e.g. defined in a notebook cell) used instead of
    cfg.task.name; it is pickled by value and shipped to every rank.  Passing the run_dir of an
    earlier run continues it from its latest checkpoint."""
    factory = task
    if factory is not None:
        cfg = cfg.replace(task__name=factory_label(factory))
    elif cfg.task.name.startswith("<") and not cfg.task.name.startswith(("<script", "<function")):
        raise ConfigError([f"task.name: {cfg.task.name} was a Python object passed as task=; pass it again "
                           "(workbench.submit(cfg, task=...)) or name a factory as package.module:function"])
    cfg_data = cfg.to_dict()
    return _start(cfg, run_dir, lambda run, contract: RankEntry(cfg_data, str(run.root), contract, factory))


def submit_script(script: str | Path | None = None, args: list[str] | None = None, cfg: JobConfig | None = None,
                  nproc: int | None = None, run_dir: str | Path | None = None, *, module: str | None = None,
                  cwd: str | Path | None = None, env: dict[str, str] | None = None) -> Run:
    """Launch a torchrun-style script (or `module`, as `python -m` would) on cfg's executor, one
    process per rank, each with torchrun's environment.  `cwd` is the ranks' working folder (default:
    this one) and `env` extra environment variables for them."""
    if (script is None) == (module is None):
        raise ConfigError(["script: give a script path or module=, not both"] if module else
                          ["script: give the script to run (or module='package.module')"])
    workdir = Path(cwd or ".").resolve()
    if not workdir.is_dir():
        raise FileNotFoundError(f"cwd {workdir} is not a folder")
    target = module or str((workdir / Path(script or "")).resolve())
    if module is None and not Path(target).is_file():
        raise FileNotFoundError(f"script {target} does not exist")
    name = module.rsplit(".", 1)[-1] if module else Path(target).stem
    cfg = (cfg or JobConfig()).replace(task__name=f"<script {name}>",
                                       **({"dist__procs_per_node": nproc} if nproc else {}))
    if not cfg.launch.name:
        cfg = cfg.replace(launch__name=safe_name(name))
    job = ScriptJob(target, tuple(args or ()), module is not None, cfg.dist.threads_per_rank, cfg.dist.stall_after_s,
                    str(workdir), dict(env or {}))
    return _start(cfg, run_dir, lambda run, contract: ScriptEntry(job, str(run.root), contract),
                  script=job.label, args=list(job.args), cwd=job.cwd)


def submit_fn(fn: Callable[..., Any], *args: Any, cfg: JobConfig | None = None, run_dir: str | Path | None = None,
              **kwargs: Any) -> Run:
    """Run fn(*args, **kwargs) on every rank of cfg's executor (local or SLURM), in fresh processes
    (safe after the notebook touched CUDA), with torchrun's environment set and the default process
    group up for dist.backend.  `fn` may be defined in a notebook cell: it is pickled by value.
    `workbench.log(step=..., **values)` inside it streams per rank; `run.results()` gives every
    rank's return value in rank order; an exception on any rank fails the run with its traceback."""
    cfg = cfg or JobConfig()
    name = getattr(fn, "__name__", "fn").strip("<>") or "fn"
    cfg = cfg.replace(task__name=f"<function {name}>", **({} if cfg.launch.name else {"launch__name": safe_name(name)}))
    d = cfg.dist
    job = FnJob(fn, tuple(args), dict(kwargs), d.backend, float(d.timeout_s), d.threads_per_rank, d.stall_after_s)
    return _start(cfg, run_dir, lambda run, contract: FnEntry(job, str(run.root), contract), function=job.label)


def check_before_submit(cfg: JobConfig) -> None:
    """What only the target can tell (GPUs, importable task, SLURM partitions): raised as ConfigError."""
    problems = cfg.problems()
    if cfg.launch.executor == "slurm":
        from workbench.launch.slurm_checks import slurm_problems

        problems += slurm_problems(cfg)
    if problems:
        raise ConfigError(problems)


def _start(cfg: JobConfig, run_dir: str | Path | None, entry: Callable[[RunDir, RankContract], Any],
           **facts: Any) -> Run:
    check_before_submit(cfg)
    run = _prepare(RunDir(Path(run_dir or default_run_dir(cfg))), cfg, facts)
    with private_umask():  # submitit's pickles and logs, and every process it starts, stay private
        executor, contract = make_executor(cfg, run)
        job = executor.submit(entry(run, contract))
    run.record_job(job.job_id)
    return Run(run.root, job)


def _prepare(run: RunDir, cfg: JobConfig, facts: dict[str, Any]) -> RunDir:
    """Make the run folder; a full disk or a folder we may not write is one ConfigError line (and
    a folder made for this run is removed again)."""
    existed = run.root.exists()
    try:
        return run.prepare(cfg, cfg.launch.executor, **facts)
    except OSError as exc:
        if not existed:
            shutil.rmtree(run.root, ignore_errors=True)
        fix = _FIXES.get(exc.errno or 0, "check the path, or set launch.run_root to another folder")
        raise ConfigError([f"launch.run_root: cannot make the run folder {run.root} ({exc.strerror or exc}); "
                           f"{fix}"]) from None


_FIXES = {
    errno.ENOSPC: "free some space, or set launch.run_root to a folder on another disk",
    errno.EDQUOT: "your disk quota is used up: free some space, or set launch.run_root elsewhere",
    errno.EACCES: "set launch.run_root to a folder you can write",
    errno.EPERM: "set launch.run_root to a folder you can write",
    errno.EROFS: "the disk is read-only: set launch.run_root to a folder you can write",
}
