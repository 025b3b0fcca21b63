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
from workbench.engine.entry import RankEntry, ScriptEntry
from workbench.engine.rendezvous import RankContract
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
    elif cfg.task.name.startswith("<") and not cfg.task.name.startswith("<script"):
        raise ConfigError([f"task.name: {cfg.task.name} was a Python object passed as task=; pass it again "
                           "(workbench.submit(cfg, task=...)) or name a factory as package.module:function"])
    cfg_data = cfg.to_dict()
    return _start(cfg, run_dir, lambda run, contract: RankEntry(cfg_data, str(run.root), contract, factory))


def submit_script(script: str | Path, args: list[str] | None = None, cfg: JobConfig | None = None,
                  nproc: int | None = None, run_dir: str | Path | None = None) -> Run:
    """Launch a torchrun-style script on cfg's executor (local or SLURM), one process per rank."""
    path = Path(script).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"script {path} does not exist")
    args = list(args or [])
    cfg = (cfg or JobConfig()).replace(task__name=f"<script {path.name}>",
                                       **({"dist__procs_per_node": nproc} if nproc else {}))
    if not cfg.launch.name:
        cfg = cfg.replace(launch__name=safe_name(path.stem))
    return _start(cfg, run_dir, lambda run, contract: ScriptEntry(str(path), args, str(run.root), contract),
                  script=str(path), args=args)


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
