"""Submitting: validate, create the run folder, hand one rank process per rank to submitit, return a Run.

`submit` trains the engine on every rank, `submit_script` runs an existing torchrun-style script or
module, `submit_fn` calls a function.  All three go through one pipeline (`_start`): the same
checks, run folder, one live job per folder, the same agent per rank and the same Run handle."""

from __future__ import annotations

import contextlib
import errno
import shutil
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config.sections import JobConfig
from workbench.engine.entry import RankEntry
from workbench.engine.script import FnPayload, ScriptPayload
from workbench.engine.tasks import factory_label, factory_options, named_task_problem, unwrapped
from workbench.errors import ArgumentError, ConfigError, ResizeWarning, SubmitError, UserFacing
from workbench.launch.executors import make_executor
from workbench.launch.run import Run, live_job
from workbench.proctree import Proc
from workbench.runfolder.layout import SHARDED_TRAINER_STATE, RunDir, default_run_dir, safe_name
from workbench.runfolder.private import private_umask, write_atomic
from workbench.runfolder.provenance import submit_provenance
from workbench.testhook import kill_point


def submit(cfg: JobConfig, task: Callable[..., Any] | None = None, run_dir: str | Path | None = None, *,
           from_scratch: bool = False, stop_with_caller: bool = False) -> Run:
    """Start `cfg` on its executor (local or SLURM) and return a live Run handle.

    `task` is an optional task factory (e.g. defined in a notebook cell) used instead of
    cfg.task.name; it is pickled by value and shipped to every rank.  Passing the run_dir of an
    earlier run continues it from its latest checkpoint (`from_scratch=True`: start over, its
    checkpoints set aside).  A local run lives on when the submitting process ends (a kernel
    restart): `Run.load(run_dir)` follows it again; `stop_with_caller=True` ends it with the caller."""
    return FreshRanks().submit(cfg, task, run_dir, from_scratch=from_scratch, stop_with_caller=stop_with_caller)


def engine_payload(cfg: JobConfig, task: Callable[..., Any] | None) -> tuple[JobConfig, Any]:
    """The config and payload.pkl content (a task factory, or None) of an engine run (submit).  A
    factory given as `task` is bound to task.options here, before anything starts
    (workbench.engine.tasks.factory_options: options written for a built-in task are not passed to
    it); the config records what it is called with."""
    if task is not None:
        options = factory_options(task, cfg.task.name, cfg.task.options)
        return cfg.replace(task__name=factory_label(task), task__options=options), task
    if cfg.task.name.startswith("<") and not cfg.task.name.startswith(("<script", "<function")):
        raise ConfigError([f"task.name: {cfg.task.name} was a Python object passed as task=; pass it again "
                           "(workbench.submit(cfg, task=...)) or name a factory as package.module:function"])
    return cfg, None


def submit_script(script: str | Path | None = None, args: list[str] | None = None, cfg: JobConfig | None = None,
                  nproc: int | None = None, run_dir: str | Path | None = None, *, module: str | None = None,
                  cwd: str | Path | None = None, env: dict[str, str] | None = None,
                  stop_with_caller: bool = False) -> Run:
    """Launch a torchrun-style script (or `module`, as `python -m` would) on cfg's executor, one
    process per rank, each with torchrun's environment.  `cwd` is the ranks' working folder (default:
    this one) and `env` extra environment variables for them."""
    return FreshRanks().submit_script(script, args, cfg, run_dir, nproc=nproc, module=module, cwd=cwd, env=env,
                                      stop_with_caller=stop_with_caller)


def script_payload(script: str | Path | None, args: list[str] | None, cfg: JobConfig | None, nproc: int | None,
                module: str | None, cwd: str | Path | None, env: dict[str, str] | None,
                ) -> tuple[JobConfig, ScriptPayload, dict[str, Any]]:
    """The config, ScriptPayload and run.json facts of a script run (submit_script)."""
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
    job = ScriptPayload(target, tuple(args or ()), module is not None, cfg.dist.threads_per_rank,
                        cfg.dist.stall_after_s, str(workdir), dict(env or {}), lost_after_s=cfg.dist.lost_after_s,
                        on_hang=cfg.dist.on_hang)
    # env's names (not its values): the agent starts a fresh worker for one torch reads as it loads
    return cfg, job, {"script": job.label, "args": list(job.args), "cwd": job.cwd, "env": sorted(job.env)}


def submit_fn(fn: Callable[..., Any], *args: Any, cfg: JobConfig | None = None, run_dir: str | Path | None = None,
              **kwargs: Any) -> Run:
    """Run fn(*args, **kwargs) on every rank of cfg's executor (local or SLURM), in processes of
    their own, never forked from the notebook (safe after it touched CUDA), with torchrun's
    environment set and the default process group up for dist.backend.  `fn` may be defined in a
    notebook cell: it is pickled by value.
    `workbench.log(step=..., **values)` inside it streams per rank; `run.results()` gives every
    rank's return value in rank order; an exception on any rank fails the run with its traceback."""
    return FreshRanks().submit_fn(fn, *args, cfg=cfg, run_dir=run_dir, **kwargs)


def fn_payload(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], cfg: JobConfig | None,
            ) -> tuple[JobConfig, FnPayload]:
    """The config and FnPayload of a function run (submit_fn)."""
    cfg = cfg or JobConfig()
    name = getattr(unwrapped(fn), "__name__", "fn").strip("<>") or "fn"
    cfg = cfg.replace(task__name=f"<function {name}>", **({} if cfg.launch.name else {"launch__name": safe_name(name)}))
    d = cfg.dist
    return cfg, FnPayload(fn, tuple(args), dict(kwargs), d.backend, float(d.timeout_s), d.threads_per_rank,
                      d.stall_after_s, lost_after_s=d.lost_after_s, on_hang=d.on_hang)


def check_before_submit(cfg: JobConfig, task: Callable[..., Any] | None = None) -> None:
    """What only the target can tell (GPUs, importable task, SLURM partitions, the model's classes):
    raised as ConfigError.  A factory named as package.module:factory is imported here (its module's
    code runs) and bound to task.options; `task` is a factory passed as an object (submit's task=)."""
    problems = cfg.problems()
    if not any(p.startswith("task.name:") for p in problems):  # else said already, without importing it
        problems += task_problems(cfg)
        problems += [] if problems else model_problems(cfg, task)
    if cfg.launch.executor == "slurm":
        from workbench.launch.slurm_checks import slurm_problems

        problems += slurm_problems(cfg)
    if problems:
        raise ConfigError(problems)


def task_problems(cfg: JobConfig) -> list[str]:
    """The task cfg names against its task.options (a named factory's module is imported)."""
    problem = named_task_problem(cfg.task.name, cfg.task.options)
    return [problem] if problem else []


def model_problems(cfg: JobConfig, task: Callable[..., Any] | None = None) -> list[str]:
    """dist.fsdp_units against the module classes of the model the task builds on the meta device
    (planning.fake.model_classes: nothing allocated).  Only for fsdp2 with units named: for anything
    else the model is not built here.  A factory that cannot be built so is left to the ranks, which
    check the same thing (engine.strategy.pick_units) on the real model."""
    if cfg.dist.strategy != "fsdp2" or not cfg.dist.fsdp_units:
        return []
    if task is None and cfg.task.name.startswith("<"):  # a script's or a function's own code holds its model
        return []
    from workbench.engine.strategy import units_problem
    from workbench.engine.tasks import resolve_factory
    from workbench.planning.fake import model_classes

    classes = model_classes(task or resolve_factory(cfg.task.name), cfg.task.options)
    problem = units_problem(classes, cfg.dist.fsdp_units) if classes is not None else None
    return [problem] if problem else []


def _start(cfg: JobConfig, run_dir: str | Path | None, *, payload: Any = None, from_scratch: bool = False,
           stop_with_caller: bool = False, facts: dict[str, Any] | None = None,
           launcher: Launches | None = None) -> Run:
    """`payload` is what the run executes beyond what the config says, pickled into the run's
    payload.pkl: a task factory (the engine's payload), a ScriptPayload or an FnPayload; None for the
    engine with cfg.task.name."""
    launcher = launcher or FreshRanks()
    launcher.check(cfg)  # a pool's ranks first: its world size and backend are fixed
    factory = payload if callable(payload) and not isinstance(payload, (ScriptPayload, FnPayload)) else None
    check_before_submit(cfg, factory)
    run = RunDir(Path(run_dir or default_run_dir(cfg)))
    existed = run.root.exists()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(run.locked("submit"))  # one submission at a time into a folder
        except OSError as exc:  # a read-only folder, a file on the way: one line, not a bare OSError
            raise _cannot_make(run, exc, existed) from None
        _check_folder_free(run)
        _check_checkpoints(run, from_scratch)
        cfg = _continued(run, cfg)
        _prepare(run, cfg, {**(facts or {}), **submit_provenance()}, existed)
        _write_payload(run, payload)
        kill_point("submit.prepared")  # a test hook: the run folder is made, nothing started
        try:
            handle = launcher.hand_over(cfg, run, stop_with_caller)
        except SubmitError:  # the scheduler refused it (SLURM's words): no job, so no run folder either
            if not existed:
                shutil.rmtree(run.root, ignore_errors=True)
            raise
    return Run(run.root, handle)


class Launches:
    """workbench.submit, submit_fn and submit_script on a launcher (fresh ranks, a pool's warm ranks, a
    sweep array's element), written once: each makes its job (engine_payload, fn_payload, script_payload) and
    starts it through the one pipeline (_start).  `cfg` is the launcher's own config, used where a
    job gives none (a pool's), or None."""

    cfg: JobConfig | None = None

    def check(self, cfg: JobConfig) -> None:
        """Raise ConfigError when cfg cannot run here (before anything is made): a pool's world size
        and backend are fixed."""
        return None

    def hand_over(self, cfg: JobConfig, run: RunDir, stop_with_caller: bool) -> Any:
        """Start the ranks on the prepared run folder; returns the job the Run handle follows."""
        raise NotImplementedError

    def _config(self, cfg: JobConfig | None) -> JobConfig | None:
        return cfg or self.cfg

    def submit(self, cfg: JobConfig | None = None, task: Callable[..., Any] | None = None,
               run_dir: str | Path | None = None, *, from_scratch: bool = False,
               stop_with_caller: bool = False) -> Run:
        """workbench.submit, here."""
        config = self._config(cfg)
        if config is None:
            raise ArgumentError("cfg: give the JobConfig to run (e.g. workbench.JobConfig.from_yaml(path))")
        config, factory = engine_payload(config, task)
        return _start(config, run_dir, payload=factory, from_scratch=from_scratch, stop_with_caller=stop_with_caller,
                      launcher=self)

    def submit_fn(self, fn: Callable[..., Any], *args: Any, cfg: JobConfig | None = None,
                  run_dir: str | Path | None = None, **kwargs: Any) -> Run:
        """workbench.submit_fn, here."""
        config, job = fn_payload(fn, args, kwargs, self._config(cfg))
        return _start(config, run_dir, payload=job, facts={"function": job.label}, launcher=self)

    def submit_script(self, script: str | Path | None = None, args: list[str] | None = None,
                      cfg: JobConfig | None = None, run_dir: str | Path | None = None, *, nproc: int | None = None,
                      module: str | None = None, cwd: str | Path | None = None, env: dict[str, str] | None = None,
                      stop_with_caller: bool = False) -> Run:
        """workbench.submit_script, here."""
        config, job, facts = script_payload(script, args, self._config(cfg), nproc, module, cwd, env)
        return _start(config, run_dir, payload=job, stop_with_caller=stop_with_caller, facts=facts, launcher=self)


class FreshRanks(Launches):
    """One RankEntry per rank through submitit: fresh processes for this run."""

    def hand_over(self, cfg: JobConfig, run: RunDir, stop_with_caller: bool) -> Any:
        with private_umask():  # submitit's pickles and logs, and every process it starts, stay private
            executor, contract = make_executor(cfg, run, stop_with_caller)
            job = executor.submit(RankEntry(str(run.root), contract, cfg.launch.max_restarts))
        kill_point("submit.started")  # a test hook: the controller runs, its job id not yet in run.json
        controller = getattr(job, "_process", None)
        found = Proc.of(controller.pid, group=True) if controller is not None else None
        run.record_job(job.job_id, **({"controller": found.to_dict()} if found else {}))
        return job


def _prepare(run: RunDir, cfg: JobConfig, facts: dict[str, Any], existed: bool) -> RunDir:
    """Make the run folder; a full disk or a folder we may not write is one ConfigError line (and
    a folder made for this run is removed again)."""
    try:
        return run.prepare(cfg, cfg.launch.executor, **facts)
    except OSError as exc:
        raise _cannot_make(run, exc, existed) from None


def _cannot_make(run: RunDir, exc: OSError, existed: bool) -> ConfigError:
    """The one line for a run folder that cannot be made or written (a folder made for it is removed)."""
    if not existed:
        shutil.rmtree(run.root, ignore_errors=True)
    if isinstance(exc, UserFacing):  # already one line naming the file (a link where a file goes)
        return ConfigError([str(exc)])
    fix = _FIXES.get(exc.errno or 0, "check the path, or set launch.run_root to another folder")
    return ConfigError([f"launch.run_root: cannot make the run folder {run.root} ({exc.strerror or exc}); {fix}"])


_FIXES = {
    errno.ENOSPC: "free some space, or set launch.run_root to a folder on another disk",
    errno.EDQUOT: "your disk quota is used up: free some space, or set launch.run_root elsewhere",
    errno.EACCES: "set launch.run_root to a folder you can write",
    errno.EPERM: "set launch.run_root to a folder you can write",
    errno.EROFS: "the disk is read-only: set launch.run_root to a folder you can write",
}


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
    found = run.checkpoint_files()
    if from_scratch and found:
        aside = run.set_aside(time.strftime("%Y%m%d-%H%M%S"))
        aside.mkdir(mode=0o700)
        for path in found:
            path.rename(aside / path.name)
        return
    unreadable = {path: _unreadable(path) for path in found}
    if found and all(unreadable.values()):
        names = "; ".join(f"{path.name}: {why}" for path, why in unreadable.items())
        raise SubmitError(f"run folder {run.root} has checkpoints but none can be read ({names}); pass "
                          "from_scratch=True (workbench run --from-scratch) to start over with them set aside")


def _continued(run: RunDir, cfg: JobConfig) -> JobConfig:
    """The config a run continues with: at another world size, the one its ranks will train with (the
    same engine.rank.continue_at they apply, from the newest checkpoint that can be read: its
    grad_accum_steps, its pinned lr_ref_batch), said before it starts.  It is what config.yaml keeps,
    so run.config, the scaling table, config_diff and the report's advice describe what ran."""
    from workbench.engine.rank import continue_at

    continued, message = continue_at(cfg, run, cfg.world_size)
    if message:
        warnings.warn(f"{run.root.name}: {message}", ResizeWarning, stacklevel=4)
    return continued


def _unreadable(path: Path) -> str | None:
    """Why a checkpoint cannot be what torch.save wrote (a zip archive; in a sharded checkpoint's
    folder, its trainer.pt beside DCP's .metadata), cheaply; None if it may be."""
    if path.is_dir():
        if not (path / ".metadata").is_file():
            return "no .metadata: its shards were never all written"
        path = path / SHARDED_TRAINER_STATE
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _write_payload(run: RunDir, payload: Any) -> None:
    """What the workers run (a task factory passed as an object, a ScriptPayload, an FnPayload), pickled by
    value where cloudpickle can (the worker unpickles it and reports a failure like any other)."""
    if payload is None:
        run.payload_pickle.unlink(missing_ok=True)
        return
    from workbench.launch.pickling import dumps

    write_atomic(run.payload_pickle, dumps(payload))  # 0600: a pickle is code
