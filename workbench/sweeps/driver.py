"""Sweeps: search a config space with DDP trials, each an ordinary run, driven from the submitting
process through Optuna's ask-and-tell interface (never inside the ranks).

The driver loop (`Sweep._step`) asks Optuna for a trial, submits its run (fresh ranks locally or on
SLURM, or a warm Pool's ranks), reads the run's metric as it streams into the run folder, reports
each new value to Optuna (`trial.report`), cancels a run the pruner stops (marked pruned in its
run.json, with when and why: its state is then "pruned") and tells Optuna each outcome.  A grid
has no pruner unless one is named; a sampled search prunes with "median" once 5 trials finished.
The study lives in the sweep folder (Optuna's journal file), so `Sweep.load(folder)` resumes it in
another process: trials still running are followed again, finished ones are not repeated, and
trials whose run never started or died with the driver are queued again with the same values.

Where trials run: locally, up to `parallel` at once and never more ranks at once than the machine
takes (validate.LOCAL_RANKS_PER_CORE per core); through a Pool, one after another in its warm ranks;
on SLURM, as the elements of one job array, `parallel` of them at once, each bound to its trial when
it starts (workbench.sweeps.array: one array per resource shape), the study here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.sections import JobConfig
from workbench.config.validate import LOCAL_RANKS_PER_CORE
from workbench.errors import ConfigError, SubmitError
from workbench.launch.run import Run
from workbench.proctree import Proc
from workbench.runfolder.layout import RunDir, SweepDir, safe_name
from workbench.runfolder.private import write_atomic
from workbench.sweeps import space as sp
from workbench.sweeps.array import SlurmArrays, slurm_space_problems
from workbench.sweeps.payload import from_old_names, unpack
from workbench.sweeps.script import SweptScript
from workbench.sweeps.study import (
    default_pruner,
    label,
    make_pruner,
    make_sampler,
    optuna_module,
    pruner_text,
    storage,
    why_pruned,
    write_work,
)
from workbench.sweeps.views import Active, counted, metric_values, missing_metric, state_named
from workbench.testhook import kill_point

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from workbench.launch.pool import Pool

POLL_S = 0.25
"""How often the driver reads the running trials' metrics."""


@dataclass
class Best:
    """The best trial so far: its number, metric value, swept values, run and config."""

    number: int
    value: float
    params: dict[str, Any]
    run: Run

    @property
    def config(self) -> JobConfig:
        return self.run.config


def sweep(cfg: JobConfig, space: Mapping[str, Any], *, payload: Any = None, trials: int | None = None,
          parallel: int = 1, metric: str = "val_loss", direction: str = "minimize", sampler: Any = None,
          pruner: Any = None, pool: Pool | None = None, executor: str | None = None, name: str | None = None,
          background: bool = True, stop_with_caller: bool = False,
          on_event: Callable[[str], None] | None = None, **old_names: Any) -> Sweep:
    """Search `space` ({field: [values]} for a grid, {field: workbench.sweeps.loguniform(a, b)} for a
    sampled range) with one run per trial and return the Sweep at once (its driver runs in a thread;
    `background=False`: the caller drives it with `wait()`).  `metric` is an eval metric (val_loss,
    val_<name>) or a logged one (loss), reported to the pruner at each eval or logged step.
    `payload` is what each trial runs (workbench.sweeps.payload): None, the engine on cfg; a task
    factory (fields task.options.*); `Fn(fn, *args)`, a function run as submit_fn runs it (fields
    fn.*); `Script("train.py", *args)` or `Script(module="pkg.train")`, a torchrun-style script run as
    submit_script runs it (fields args.*: args.lr is --lr=VALUE, or the style of the base argument it
    replaces; the script logs its metric with workbench.log).  The keywords task=, fn=, fn_args=,
    script=, script_args= and module= still work, deprecated.
    `pruner`: "median", "percentile", "hyperband", "none" or an Optuna pruner; by default none for a
    grid (every point runs to its end) and "median" for a sampled search (a trial worse than the
    median of the finished trials at the same step stops, once study.STARTUP_TRIALS have finished)."""
    parts = unpack(from_old_names(payload, old_names))
    task, fn, fn_args = parts["task"], parts["fn"], parts["fn_args"]
    script, script_args, module = parts["script"], parts["script_args"], parts["module"]
    optuna = optuna_module()
    space = sp.normalised(space)
    cfg = cfg.replace(launch__executor=executor) if executor else cfg
    _check_arguments(trials, parallel, direction, space)
    swept = _swept_script(script, module, script_args, task, fn)
    cfg = _base_config(cfg, task, fn, swept)
    sp.check_space(cfg, space, fn, task=task, script=swept)
    points = sp.grid_points(space) if sp.is_grid(space) else []  # type: ignore[arg-type]
    first = sp.apply_params(cfg, points[0] if points else {f: _corner(v) for f, v in space.items()})
    _check_target(first, pool, space, cfg, task)
    made_sampler = make_sampler(sampler, space)  # a bad name (sampler or pruner): nothing made
    made_pruner = make_pruner(pruner, made_sampler)
    folder = SweepDir.new(cfg.launch.run_root, safe_name(name or cfg.launch.name or cfg.task.name)).create()
    write_atomic(folder.config, cfg.to_yaml().encode())  # beside and renamed: no link is written through
    write_work(folder, task, fn, fn_args)
    folder.update_meta(name=folder.root.name, space=sp.space_to_json(space), metric=metric, direction=direction,
                       trials=trials or len(points), parallel=parallel,
                       executor="pool" if pool else cfg.launch.executor,
                       sampler=label(sampler, "grid" if points else "tpe"),
                       pruner=label(pruner, default_pruner(made_sampler)),
                       script=swept.to_json() if swept else None, created=time.time())
    study = optuna.create_study(storage=storage(folder), study_name="sweep", direction=direction,
                                sampler=made_sampler, pruner=made_pruner)
    return Sweep(folder, study, space, cfg, trials=trials or len(points), parallel=parallel, metric=metric,
                 task=task, fn=fn, fn_args=fn_args, script=swept, pool=pool, stop_with_caller=stop_with_caller,
                 on_event=on_event).start(background)


def _swept_script(script: str | Path | None, module: str | None, script_args: Sequence[str], task: Any,
                  fn: Any) -> SweptScript | None:
    if script is None and module is None:
        if script_args:
            raise ConfigError([f"payload: Script() has arguments {list(script_args)!r} but no script; pass the script "
                               "they are for (workbench.sweeps.Script('train.py', ...)), or module="])
        return None
    sp.check_kind({}, task=task, fn=fn, script=script or module)  # one thing swept, before the script is looked for
    return SweptScript.given(script, script_args, module)


def _base_config(cfg: JobConfig, task: Any, fn: Any, script: SweptScript | None) -> JobConfig:
    """The config every trial starts from, named as submit names the job (a factory, function or script)."""
    if script is not None:
        return script.base_config(cfg)
    if fn is not None:
        from workbench.launch.submit import fn_payload

        return fn_payload(fn, (), {}, cfg)[0]
    return sp.factory_config(cfg, task) if task is not None else cfg


def _check_arguments(trials: int | None, parallel: int, direction: str, space: Mapping[str, Any]) -> None:
    problems = []
    if trials is not None and (not isinstance(trials, int) or isinstance(trials, bool) or trials < 1):
        problems.append(f"trials: {trials!r} must be a whole number >= 1")
    if trials is None and not sp.is_grid(space):
        problems.append("trials: a space with a distribution needs trials=N (how many runs to sample)")
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        problems.append(f"parallel: {parallel!r} must be a whole number >= 1 (trials running at once)")
    if direction not in ("minimize", "maximize"):
        problems.append(f"direction: {direction!r} must be 'minimize' or 'maximize'")
    if problems:
        raise ConfigError(problems)


def _corner(values: list[Any] | sp.Distribution) -> Any:
    return values[0] if isinstance(values, list) else values.corners()[0]


def _check_target(first: JobConfig, pool: Pool | None, space: Mapping[str, Any], cfg: JobConfig,
                  task: Callable[..., Any] | None) -> None:
    """What only the target can tell (an importable task, SLURM's partitions, the model's classes, a
    pool's world size), checked once, and for a pool every world size the space can ask."""
    from workbench.launch.submit import check_before_submit

    if pool is None and slurm_space_problems(cfg, dict(space)):  # before asking the cluster anything
        raise ConfigError(slurm_space_problems(cfg, dict(space)))
    check_before_submit(first, task)
    if pool is not None:
        lists = {f: v if isinstance(v, list) else v.corners() for f, v in space.items() if f.startswith("dist.")}
        for point in sp.grid_points(lists) if lists else [{}]:
            pool.check(sp.apply_params(cfg, point))


class Sweep:
    """A sweep: its trials (one run each), the study and the driver that runs them.  `frame()` has
    one row per trial; `best`, `runs`, `plot()`, `wait()`, `cancel()`, `folder`."""

    def __init__(self, folder: SweepDir, study: optuna.Study, space: dict[str, Any], cfg: JobConfig, *,
                 trials: int, parallel: int, metric: str, task: Any = None, fn: Any = None,
                 fn_args: tuple[Any, ...] = (), script: SweptScript | None = None, pool: Pool | None = None,
                 stop_with_caller: bool = False, on_event: Callable[[str], None] | None = None):
        self.dir, self.study, self.space, self.cfg = folder, study, space, cfg
        self.trials, self.parallel, self.metric = trials, parallel, metric
        self.task, self.fn, self.fn_args, self.pool = task, fn, fn_args, pool
        self.script = script
        """The swept script (script=), its base arguments and working folder; None for other sweeps."""
        self.stop_with_caller, self.on_event = stop_with_caller, on_event
        self.events: list[str] = []
        """One line per trial event (started, pruned, finished, failed), as the CLI prints them."""
        self.active: dict[int, Active] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.readonly = False
        """Opened with Sweep.load(folder, resume=False): another process drives it; this one reads."""
        self.arrays = SlurmArrays(self) if cfg.launch.executor == "slurm" and pool is None else None
        """On SLURM: the sweep's job arrays, whose started elements the driver binds to trials."""

    def __repr__(self) -> str:
        return f"Sweep({str(self.folder)!r}, {self.count_done()}/{self.trials} trials done)"

    @property
    def folder(self) -> Path:
        return self.dir.root

    @property
    def name(self) -> str:
        return self.dir.root.name

    @property
    def pruner(self) -> str:
        """What the study's pruner does, in a few words: "none (every trial runs to its end)",
        "median, once 5 trials finished", or an Optuna pruner's class."""
        return pruner_text(self.study.pruner)

    # --- the driver ------------------------------------------------------------------------------
    def start(self, background: bool = True) -> Sweep:
        """Record this process as the driver; with `background`, drive in a thread from now on."""
        me = Proc.of(os.getpid())
        self.dir.update_meta(driver=me.to_dict() if me else None)
        if background:
            self._thread = threading.Thread(target=self._drive, name=f"sweep {self.name}", daemon=True)
            self._thread.start()
        return self

    def _drive(self) -> None:
        try:
            while not self._stop.is_set() and not self.done:
                self._step()
                self._stop.wait(POLL_S)
            self._mark_finished()
        except BaseException as exc:  # noqa: BLE001 - kept for wait() to raise in the caller
            self.error = exc

    def _step(self) -> None:
        if (self.dir.read_meta() or {}).get("cancelled"):  # cancelled here, or from another process
            self._stop.set()
            self._cancel_active()
            return
        with self._lock:
            for number in list(self.active):
                self._poll(number)
            if self.arrays is not None:  # SLURM: the trials are the elements of job arrays
                if not self._stop.is_set() and not self.done:
                    self.arrays.step()
                return
            while not self._stop.is_set() and self._can_start():
                self.start_trial()

    @property
    def done(self) -> bool:
        """Every trial has an outcome (or the sweep was cancelled).  Read under the driver's lock: a
        trial asked for is counted before its run is started."""
        if self.readonly:
            meta = self.dir.read_meta() or {}
            live = [t for t in self._trials() if t.state.name in ("RUNNING", "WAITING")]
            return bool(meta.get("finished") or meta.get("cancelled")) or (not live and not self._can_ask())
        with self._lock:
            return self.cancelled or (not self.active and not self._can_ask())

    def wait(self, timeout: float | None = None, on_poll: Callable[[Sweep], None] | None = None) -> Sweep:
        """Block until every trial has an outcome (drives the sweep here if no thread does)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done and self.error is None:
            if self._thread is None and not self.readonly:
                self._step()
            if on_poll is not None:
                on_poll(self)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.folder}: {self.count_done()}/{self.trials} trials done after "
                                   f"{timeout} s")
            if self._thread is not None and not self._thread.is_alive():
                break
            self._stop.wait(POLL_S)
        if self.error is not None:
            raise self.error
        self._mark_finished()
        return self

    def _mark_finished(self) -> None:
        if self.done and not self.cancelled and not (self.dir.read_meta() or {}).get("finished"):
            self.dir.update_meta(finished=time.time())
            if self.arrays is not None and not self.readonly:
                self.arrays.release(strict=False)  # elements still queued: nothing left for them
            best = self.best
            self.say(f"sweep {self.name} done: {self.count_done()} trials" +
                      (f"; best trial {best.number}: {self.metric} {best.value:.4g} ({_shown(best.params)})"
                       if best else ""))

    def cancel(self) -> None:
        """Stop the sweep: every running trial's run is cancelled (no process left), none starts.
        From a handle opened with resume=False, the driving process sees it at its next poll."""
        self.dir.update_meta(cancelled=time.time())  # first: a driver elsewhere starts no new trial
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self.readonly:
            running = [d for t in self._trials() if t.state.name == "RUNNING" and _started(d := self.run_dir_of(t))]
            stop_all([Run.load(d) for d in running if d is not None], by=f"sweep {self.name} cancelled")
        self._cancel_active()
        self.say(f"sweep {self.name} cancelled: every trial's run stopped")

    def _cancel_active(self) -> None:
        with self._lock:
            stop_all([active.run for active in self.active.values()], by=f"sweep {self.name} cancelled")
            for number, active in list(self.active.items()):
                self._tell(number, active, "FAIL", outcome="cancelled")
            self.cancelled = True
            if self.arrays is not None:
                self.arrays.release()  # queued and waiting elements too: scancel JOB

    # --- trials ----------------------------------------------------------------------------------
    def _trials(self) -> list[Any]:
        return self.study.get_trials(deepcopy=False)

    def run_dir_of(self, trial: Any) -> Path | None:
        """The trial's run folder, in this sweep folder: its run_dir attribute is the folder's name
        (a path before, the original's in a copied sweep: its name is taken, so a copy reads its own)."""
        named = trial.user_attrs.get("run_dir")
        return self.folder / Path(str(named)).name if named else None

    def count_done(self) -> int:
        return sum(1 for t in self._trials() if t.state.is_finished() and counted(t))

    def _can_ask(self) -> bool:
        from optuna.trial import TrialState

        found = self._trials()
        if any(t.state == TrialState.WAITING for t in found):
            return True
        return sum(1 for t in found if counted(t)) < self.trials and not self.cancelled

    def wants_trial(self) -> bool:
        """Whether a trial may start now: the sweep is neither stopping nor cancelled and Optuna has
        one to give (one queued again, or fewer counted than `trials`).  The SLURM array asks it
        before it binds a waiting element to a trial."""
        return not self.cancelled and not self._stop.is_set() and self._can_ask()

    def _can_start(self) -> bool:
        if not self._can_ask():
            return False
        if self.pool is not None:
            return not self.active  # one after another in the warm ranks
        if len(self.active) >= self.parallel:
            return False
        if self.cfg.launch.executor != "local" or not self.active:
            return True
        busy = sum(a.run.world_size for a in self.active.values())
        return busy + self._largest_world() <= LOCAL_RANKS_PER_CORE * _cores()

    def _largest_world(self) -> int:
        lists = {f: v if isinstance(v, list) else v.corners() for f, v in self.space.items() if f.startswith("dist.")}
        return max(sp.apply_params(self.cfg, p).world_size for p in (sp.grid_points(lists) if lists else [{}]))

    def start_trial(self, trial: Any = None, launcher: Any = None) -> None:
        """Ask Optuna for a trial (or take the one given) and start its run; `launcher`: on SLURM,
        the array element the trial is bound to (workbench.sweeps.array binds them)."""
        trial = self.study.ask() if trial is None else trial
        kill_point("sweep.asked")  # each window a killed driver can leave is resumed (tests/ddp/test_sweep_faults)
        params = {f: _suggest(trial, f, v) for f, v in self.space.items()}
        kill_point("sweep.values")
        run_dir = self.dir.trial(trial.number)
        trial.set_user_attr("run_dir", run_dir.name)  # relative to the sweep: a copied sweep names its own trials
        submitted = time.time()
        try:
            run = self._submit(sp.apply_params(self.cfg, params), params, run_dir, launcher)
        except (ConfigError, SubmitError) as exc:
            trial.set_user_attr("outcome", "failed")
            trial.set_user_attr("error", str(exc))
            self.study.tell(trial, state=state_named("FAIL"))
            self.say(f"trial {trial.number} could not start: {exc}")
            return
        kill_point("sweep.submitted")
        trial.set_user_attr("submitted", submitted)
        self.active[trial.number] = Active(trial, run, submitted)
        self.say(f"trial {trial.number} started ({_shown(params)}): {run.folder}")

    def _submit(self, cfg: JobConfig, params: dict[str, Any], run_dir: Path, launcher: Any = None) -> Run:
        """`launcher`: a SLURM array element (sweeps.array.Element), submitted to as to a pool."""
        from workbench.launch.submit import submit, submit_fn

        pool = launcher or self.pool
        if self.script is not None:
            return self.script.submit(cfg, params, run_dir, pool, self.stop_with_caller)
        kwargs = sp.fn_kwargs(params)
        if pool is not None:
            if self.fn is not None:
                return pool.submit_fn(self.fn, *self.fn_args, cfg=cfg, run_dir=run_dir, **kwargs)
            return pool.submit(cfg, task=self.task, run_dir=run_dir)
        if self.fn is not None:
            return submit_fn(self.fn, *self.fn_args, cfg=cfg, run_dir=run_dir, **kwargs)
        return submit(cfg, task=self.task, run_dir=run_dir, stop_with_caller=self.stop_with_caller)

    def _poll(self, number: int) -> None:
        """Report the trial's new metric values; prune it, or tell its outcome once its run ended."""
        active = self.active[number]
        ended = active.run.job_done()
        status = active.run.status(ended)
        trial = active.trial
        new = [(s, v) for s, v in metric_values(active.run, self.metric) if s > active.reported]
        for step, value in new:
            trial.report(value, step)
            active.reported, active.last = step, value
        if not status.done and new and trial.should_prune():
            self._prune(number, active)
        elif status.done and ended:
            self._finish(number, active, status.state)

    def _prune(self, number: int, active: Active) -> None:
        """Stop the trial the pruner chose, saying when and why in its run.json, the trial's record
        (its "why") and the sweep's events."""
        run, why = active.run, why_pruned(self.study, number, self.metric)
        run.dir.update_meta(pruned={"step": active.reported, "value": active.last, "time": time.time(),
                                    "sweep": str(self.folder), "pruner": type(self.study.pruner).__name__,
                                    "why": why})
        run.cancel(by=f"sweep {self.name}: {why}")
        self._tell(number, active, "PRUNED", outcome="pruned", why=why)
        self.say(f"trial {number} {why}")

    def _finish(self, number: int, active: Active, state: str) -> None:
        if state == "pruned":  # followed again after a driver that pruned it stopped before telling Optuna
            why = str((active.run.meta.get("pruned") or {}).get("why") or "pruned")
            self._tell(number, active, "PRUNED", outcome="pruned", why=why)
            self.say(f"trial {number} {why}")
            return
        if state == "finished" and active.last is not None:
            self._tell(number, active, "COMPLETE", value=active.last, outcome="finished")
            best = self.study.best_trial
            self.say(f"trial {number} finished: {self.metric} {active.last:.4g} (best: trial {best.number}, "
                      f"{best.value:.4g})")
            return
        if state == "finished":
            why, state = missing_metric(active.run, self.metric), "failed"
            self._tell(number, active, "FAIL", outcome="failed", error=why)
        else:
            failure = active.run.exception() if state == "failed" else None
            why = f"{failure.type}: {failure.message}" if failure is not None else state
            self._tell(number, active, "FAIL", outcome=state, error=why)
        self.say(f"trial {number} {state}: {why}")

    def _tell(self, number: int, active: Active, state: str, value: float | None = None, **attrs: Any) -> None:
        run = active.run
        status = run.status()
        facts = {"steps": status.step, "seconds": time.time() - active.submitted,
                 "samples_per_step": run.samples_per_step(), **attrs}
        start = (run.event_summary().start or {}).get("time")
        if isinstance(start, (int, float)):
            facts["start_latency_s"] = float(start) - active.submitted
        for key, item in facts.items():
            active.trial.set_user_attr(key, item)
        self.study.tell(active.trial, value, state=state_named(state), skip_if_finished=True)
        self.active.pop(number, None)

    def say(self, line: str) -> None:
        """Record one event line (`events`) and hand it to `on_event`: the driver, the SLURM array and
        a resume say what happens to the trials through it."""
        self.events.append(line)
        if self.on_event is not None:
            self.on_event(line)

    # --- views -----------------------------------------------------------------------------------
    def frame(self) -> pd.DataFrame:
        """One row per trial: number, state, the swept fields, the metric's best and last value,
        steps, seconds, start latency, a note (why it was pruned, or why it failed) and the run folder."""
        from workbench.sweeps.views import trial_frame

        return trial_frame(self)

    @property
    def runs(self) -> list[Run]:
        """Every trial's run, in trial order: those whose run has started (a trial being started,
        its run folder made but its run.json not yet written, is not listed until it is)."""
        found = [self.run_dir_of(t) for t in self._trials()]
        return [Run.load(d) for d in found if d is not None and _started(d)]

    @property
    def best(self) -> Best | None:
        """The best finished trial (its run and config), or None before one finished."""
        from optuna.trial import TrialState

        done = [t for t in self._trials() if t.state == TrialState.COMPLETE]
        if not done:
            return None
        best = self.study.best_trial
        return Best(best.number, float(best.value or 0.0), dict(best.params),
                    Run.load(self.run_dir_of(best) or self.dir.trial(best.number)))

    def plot(self, **options: Any) -> Any:
        """The metric against each swept field, and every trial's curve by samples seen (pruned ones
        faint): a matplotlib Figure."""
        from workbench.sweeps.plot import plot_sweep

        return plot_sweep(self.frame(), self.curves(), self.metric, self.space, **options)

    def curves(self) -> dict[int, list[tuple[float, float]]]:
        """Trial number -> (samples seen, metric) of every reported value."""
        out = {}
        for t in self._trials():
            per = t.user_attrs.get("samples_per_step") or 1
            out[t.number] = [(step * per, value) for step, value in sorted(t.intermediate_values.items())]
        return out

    # --- resume ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder: str | Path, *, resume: bool = True, pool: Pool | None = None, sampler: Any = None,
             pruner: Any = None, background: bool = True, stop_with_caller: bool = False,
             on_event: Callable[[str], None] | None = None, trust: bool = False) -> Sweep:
        """Reopen a sweep folder (after a kernel restart, or from another process).  With `resume`,
        trials whose runs still run are followed again, those whose run never started or died with
        the old driver are queued again with the same values, and the sweep goes on to its number of
        trials; finished and pruned trials are not repeated.

        Resuming unpickles the sweep's task (payload.pkl), code that runs as you: only from a folder that is
        your own and writable by no one else (UntrustedFileError names the file and its owner), or
        with `trust=True`.  A read-only view (`resume=False`) reads no pickle."""
        from workbench.sweeps.views import open_sweep, reattach

        sweep = open_sweep(cls, SweepDir(Path(folder)), pool, sampler, pruner, stop_with_caller, on_event,
                           resume=resume, trust=trust)
        sweep.script = SweptScript.from_json((sweep.dir.read_meta() or {}).get("script"))
        if not resume:
            sweep.readonly = True
            return sweep
        reattach(sweep)
        return sweep.start(background)


def stop_all(runs: Sequence[Run], by: str) -> None:
    """Cancel every run at once: each asked to stop first (SIGTERM to its controller, scancel), then
    each waited for; together they take as long as the slowest, not the sum (one trial after another,
    9.1 s for two, the second training on meanwhile)."""
    for run in runs:
        run.cancel(by=by, wait=False)
    for run in runs:
        run.cancel(by=by)


def _started(run_dir: Path | None) -> bool:
    """The trial's run folder (its run_dir attribute) holds a run: its run.json is written
    (atomically) once the run started."""
    return run_dir is not None and RunDir(run_dir).meta.is_file()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _suggest(trial: Any, name: str, values: list[Any] | sp.Distribution) -> Any:
    if isinstance(values, list):
        return trial.suggest_categorical(name, values)
    if values.kind == "choice":
        return trial.suggest_categorical(name, list(values.choices))
    if values.kind == "int":
        return trial.suggest_int(name, int(values.low), int(values.high), step=values.step)
    return trial.suggest_float(name, values.low, values.high, log=values.kind == "loguniform")


def _shown(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
