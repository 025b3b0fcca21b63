"""submit(): validate, create the run folder, hand one task per rank to submitit, return a Run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from workbench.config import JobConfig
from workbench.configtypes import ConfigError
from workbench.engine.tasks import factory_label
from workbench.launch.executors import make_executor
from workbench.launch.run import Run
from workbench.launch.runfolder import default_run_dir, prepare_run_dir, record_job
from workbench.launch.worker import RankEntry


def check_before_submit(cfg: JobConfig, task: Any = None) -> None:
    """Config problems plus, for SLURM, what the cluster says: all raised together as ConfigError."""
    problems = cfg.problems()
    if task is None and cfg.task.name.startswith("<") and not cfg.task.name.startswith("<script"):
        problems.append(f"task.name: {cfg.task.name} was a Python object passed as task=; pass it again "
                        "(workbench.submit(cfg, task=...)) or name a factory as package.module:function")
    if cfg.launch.executor == "slurm":
        from workbench.launch.slurm_checks import slurm_problems

        problems += slurm_problems(cfg)
    if problems:
        raise ConfigError(problems)


def submit(cfg: JobConfig, task: Callable[..., Any] | None = None, run_dir: str | Path | None = None) -> Run:
    """Start `cfg` on its executor (local or SLURM) and return a live Run handle.

    `task` is an optional factory object (e.g. defined in a notebook cell) used instead of
    cfg.task.name; it is pickled by value and shipped to every rank.  Passing the run_dir of an
    earlier run continues it from its latest checkpoint."""
    if task is not None:
        cfg = cfg.replace(task__name=factory_label(task))
    check_before_submit(cfg, task)
    run = prepare_run_dir(run_dir or default_run_dir(cfg), cfg, cfg.launch.executor)
    executor, task_env = make_executor(cfg, run)
    entry = RankEntry(cfg.to_dict(), str(run.root), task_env, task)
    job = executor.submit(entry)
    record_job(run, job)
    return Run(run.root, job)
