"""Submitting: validate, create the run folder, hand one rank process per rank to submitit, return a Run.

`submit` trains the engine on every rank; `submit_script` runs an existing torchrun-style script.
Both go through one pipeline (`_start`), so both get the same checks, run folder and Run handle."""

from __future__ import annotations

import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import JobConfig
from workbench.configtypes import ConfigError
from workbench.engine.entry import RankEntry, ScriptEntry
from workbench.engine.rendezvous import RankContract
from workbench.engine.tasks import factory_label
from workbench.launch.executors import make_executor
from workbench.launch.run import Run, live_job
from workbench.proctree import Proc
from workbench.provenance import submit_provenance
from workbench.rundir import RunDir, default_run_dir


class SubmitError(RuntimeError):
    """The run cannot start as asked (its folder is in use, its checkpoints cannot be read); the
    message says what to do."""


def submit(cfg: JobConfig, task: Callable[..., Any] | None = None, run_dir: str | Path | None = None, *,
           from_scratch: bool = False, stop_with_caller: bool = False) -> Run:
    """Start `cfg` on its executor (local or SLURM) and return a live Run handle.

    `task` is an optional task factory (e.g. defined in a notebook cell) used instead of
    cfg.task.name; it is pickled by value and shipped to every rank.  Passing the run_dir of an
    earlier run continues it from its latest checkpoint (`from_scratch=True`: start over, its
    checkpoints set aside).  A local run lives on when the submitting process ends (a kernel
    restart): `Run.load(run_dir)` follows it again; `stop_with_caller=True` ends it with the caller."""
    factory = task
    if factory is not None:
        cfg = cfg.replace(task__name=factory_label(factory))
    elif cfg.task.name.startswith("<") and not cfg.task.name.startswith("<script"):
        raise ConfigError([f"task.name: {cfg.task.name} was a Python object passed as task=; pass it again "
                           "(workbench.submit(cfg, task=...)) or name a factory as package.module:function"])
    return _start(cfg, run_dir, lambda run, contract: RankEntry(str(run.root), contract, cfg.launch.max_restarts),
                  factory=factory, from_scratch=from_scratch, stop_with_caller=stop_with_caller)


def submit_script(script: str | Path, args: list[str] | None = None, cfg: JobConfig | None = None,
                  nproc: int | None = None, run_dir: str | Path | None = None, *,
                  stop_with_caller: bool = False) -> Run:
    """Launch a torchrun-style script on cfg's executor (local or SLURM), one process per rank."""
    path = Path(script).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"script {path} does not exist")
    args = list(args or [])
    cfg = (cfg or JobConfig()).replace(task__name=f"<script {path.name}>",
                                       **({"dist__procs_per_node": nproc} if nproc else {}))
    if not cfg.launch.name:
        cfg = cfg.replace(launch__name=path.stem)
    return _start(cfg, run_dir, lambda run, contract: ScriptEntry(str(path), args, str(run.root), contract,
                                                                  cfg.launch.max_restarts),
                  stop_with_caller=stop_with_caller, facts={"script": str(path), "args": args})


def check_before_submit(cfg: JobConfig) -> None:
    """What only the target can tell (GPUs, importable task, SLURM partitions): raised as ConfigError."""
    problems = cfg.problems()
    if cfg.launch.executor == "slurm":
        from workbench.launch.slurm_checks import slurm_problems

        problems += slurm_problems(cfg)
    if problems:
        raise ConfigError(problems)


def _start(cfg: JobConfig, run_dir: str | Path | None, entry: Callable[[RunDir, RankContract], Any], *,
           factory: Callable[..., Any] | None = None, from_scratch: bool = False, stop_with_caller: bool = False,
           facts: dict[str, Any] | None = None) -> Run:
    check_before_submit(cfg)
    run = RunDir(Path(run_dir or default_run_dir(cfg)))
    with run.locked("submit"):  # one submission at a time into a folder
        _check_folder_free(run)
        _check_checkpoints(run, from_scratch)
        run.prepare(cfg, cfg.launch.executor, **(facts or {}), **submit_provenance())
        _write_task(run, factory)
        executor, contract = make_executor(cfg, run, stop_with_caller)
        job = executor.submit(entry(run, contract))
        controller = getattr(job, "_process", None)
        found = Proc.of(controller.pid, group=True) if controller is not None else None
        run.record_job(job.job_id, **({"controller": found.to_dict()} if found else {}))
    return Run(run.root, job)


def _check_folder_free(run: RunDir) -> None:
    """One live job per run folder: a second one would write over the first one's files."""
    if not run.meta.exists():
        return
    alive = live_job(run)
    if alive:
        raise SubmitError(f"run folder {run.root} is in use by {alive}, still running; wait for it, cancel it "
                          f"(workbench cancel {run.root}, or Run.load(folder).cancel()), or choose another folder")


def _check_checkpoints(run: RunDir, from_scratch: bool) -> None:
    """A resumed run with checkpoints none of which can be read fails here, naming them, instead of
    silently training from step 0.  `from_scratch` sets every checkpoint aside instead."""
    found = sorted(run.checkpoints.glob("step-*.pt")) if run.checkpoints.is_dir() else []
    if from_scratch and found:
        aside = run.checkpoints / f"set-aside-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir(mode=0o700)
        for path in found:
            path.rename(aside / path.name)
        return
    unreadable = {path: _unreadable(path) for path in found}
    if found and all(unreadable.values()):
        names = "; ".join(f"{path.name}: {why}" for path, why in unreadable.items())
        raise SubmitError(f"run folder {run.root} has checkpoints but none can be read ({names}); pass "
                          "from_scratch=True (workbench run --from-scratch) to start over with them set aside")


def _unreadable(path: Path) -> str | None:
    """Why a checkpoint cannot be what torch.save wrote (a zip archive), cheaply; None if it may be."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _write_task(run: RunDir, factory: Callable[..., Any] | None) -> None:
    """The task factory passed as an object, pickled by value where cloudpickle can (the worker
    unpickles it and reports a failure like any other)."""
    if factory is None:
        run.task_pickle.unlink(missing_ok=True)
        return
    import cloudpickle  # type: ignore[import-untyped]

    with open(run.task_pickle, "wb") as fh:
        cloudpickle.dump(factory, fh)
