"""A sweep read back: its trial table, reopening its folder (Sweep.load), following its trials again
after the driver was gone, and its row in list_sweeps()."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.sections import JobConfig
from workbench.errors import DamagedFileWarning, RunFolderError, SubmitError
from workbench.launch.executors import finish_submission
from workbench.launch.ours import unrecorded_controller
from workbench.launch.run import Run
from workbench.proctree import Proc
from workbench.runfolder.layout import SweepDir, sweeps_under
from workbench.sweeps import space as sp
from workbench.sweeps.study import damaged

if TYPE_CHECKING:
    import pandas as pd

    from workbench.sweeps.driver import Sweep

@dataclass
class Active:
    trial: Any
    """The optuna.trial.Trial (its reports go to the study's storage)."""
    run: Run
    submitted: float
    reported: int = -1
    last: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def state_named(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


NOT_COUNTED = ("requeued", "cancelled")
"""Outcomes of trials that do not count towards the sweep's number (a resume runs their values again)."""


def counted(trial: Any) -> bool:
    return trial.user_attrs.get("outcome") not in NOT_COUNTED


LABELS = {"COMPLETE": "finished", "PRUNED": "pruned", "WAITING": "queued", "RUNNING": "running", "FAIL": "failed"}


def trial_frame(sweep: Sweep) -> pd.DataFrame:
    """One row per trial: number, state, the swept fields, <metric>_best, <metric>_last, steps,
    seconds, start_latency_s, note (a pruned trial's when and why, a failed one's error), run (its folder)."""
    import pandas as pd

    metric, fields = sweep.metric, list(sweep.space)
    columns = ["number", "state", *fields, f"{metric}_best", f"{metric}_last", "steps", "seconds",
               "start_latency_s", "note", "run"]
    rows = [_row(sweep, t, metric) for t in sweep.study.get_trials(deepcopy=False)]
    return pd.DataFrame(rows, columns=columns)


def _row(sweep: Sweep, t: Any, metric: str) -> dict[str, Any]:
    attrs, values = t.user_attrs, dict(t.intermediate_values)
    if t.value is not None:
        values = values or {0: t.value}
    series = [v for _, v in sorted(values.items())]
    pick = min if sweep.study.direction.name == "MINIMIZE" else max
    row = {"number": t.number, "state": attrs.get("outcome") or LABELS.get(t.state.name, t.state.name.lower()),
           **t.params, f"{metric}_best": pick(series) if series else None,
           f"{metric}_last": t.value if t.value is not None else (series[-1] if series else None),
           "steps": attrs.get("steps"), "seconds": attrs.get("seconds"),
           "start_latency_s": attrs.get("start_latency_s"), "note": attrs.get("why") or attrs.get("error"),
           "run": str(sweep.run_dir_of(t)) if attrs.get("run_dir") else None}
    active = sweep.active.get(t.number)
    if active is not None and t.state.name == "RUNNING":
        status = active.run.status()
        row.update(state=status.state, steps=status.step, seconds=time.time() - active.submitted)
    return row


def open_sweep(cls: type[Sweep], folder: SweepDir, pool: Any, sampler: Any, pruner: Any, stop_with_caller: bool,
               on_event: Any, resume: bool = True, trust: bool = False) -> Sweep:
    """The sweep in `folder`; its task or function (payload.pkl) is unpickled only to `resume` it (a
    read-only view submits nothing), and only from a folder that is the user's own and private, or
    with `trust` (runfolder.private.check_trusted)."""
    from workbench.sweeps.study import (
        PRUNERS,
        SAMPLERS,
        check_journal,
        make_pruner,
        make_sampler,
        optuna_module,
        read_work,
        storage,
    )

    meta = _sweep_meta(folder)
    optuna = optuna_module()
    space = sp.space_from_json(meta["space"])
    named = meta.get("sampler") if meta.get("sampler") in SAMPLERS else None
    pruned = meta.get("pruner") if meta.get("pruner") in PRUNERS else None
    made_sampler = make_sampler(sampler or named, space)
    check_journal(folder, repair=resume and not driving(meta))
    try:
        study = optuna.load_study(study_name="sweep", storage=storage(folder), sampler=made_sampler,
                                  pruner=make_pruner(pruner or pruned, made_sampler))
    except Exception as exc:  # noqa: BLE001 - lines of JSON that are no study: damaged, one line
        raise damaged(folder, folder.journal, f"Optuna cannot read it back ({type(exc).__name__}: {exc})") from None
    work = read_work(folder, trust) if resume else {}
    return cls(folder, study, space, JobConfig.from_yaml(folder.config), trials=int(meta["trials"]),
               parallel=int(meta.get("parallel") or 1), metric=str(meta["metric"]), task=work.get("task"),
               fn=work.get("fn"), fn_args=tuple(work.get("fn_args") or ()), pool=pool,
               stop_with_caller=stop_with_caller, on_event=on_event)


SWEEP_FIELDS = {"space": dict, "trials": int, "metric": str}
"""The fields of sweep.json a sweep cannot be reopened without, and their types."""


def _sweep_meta(folder: SweepDir) -> dict[str, Any]:
    """sweep.json, or one RunFolderError line: no such folder, no sweep.json, or a damaged one."""
    with warnings.catch_warnings():  # a damaged sweep.json is said once, in the error
        warnings.simplefilter("ignore", DamagedFileWarning)
        meta = folder.read_meta() if folder.root.is_dir() else None
    if meta is None and folder.meta.exists():
        raise damaged(folder, folder.meta, "it is not a JSON object")
    if meta is None:
        why = "no such folder" if not folder.root.is_dir() else "no sweep.json"
        raise RunFolderError(f"{folder.root}: not a sweep folder ({why}); give the folder workbench.sweep printed, "
                             "e.g. runs/sweep-quickstart-20250101-120000-000 (workbench.sweeps.list_sweeps() lists "
                             "them)")
    wrong = [f for f, kind in SWEEP_FIELDS.items() if not isinstance(meta.get(f), kind)]
    if wrong:
        raise damaged(folder, folder.meta, f"{', '.join(wrong)} missing or of the wrong type")
    return meta


def driving(meta: dict[str, Any]) -> bool:
    """Whether a live process drives the sweep (its driver is alive and the sweep is not over)."""
    driver = Proc.from_dict(meta.get("driver"))
    return bool(driver and driver.alive() and not meta.get("finished") and not meta.get("cancelled"))


def reattach(sweep: Sweep) -> None:
    """Take the sweep over from a driver that is gone: follow the runs of trials still running (or
    that finished meanwhile); queue again, with the same values, trials whose run never started or
    ended with the old driver."""
    import optuna

    meta = sweep.dir.read_meta() or {}
    if driving(meta):
        raise SubmitError(f"sweep {sweep.folder} is driven by pid {meta['driver']['pid']}, still running; follow it "
                          "with Sweep.load(folder, resume=False), or cancel it there")
    stale = Path(f"{sweep.dir.journal}.lock")  # Optuna's journal lock, held by the driver alone
    if stale.is_symlink():  # the old driver died holding it: Optuna would wait 30 s, then break it
        stale.unlink(missing_ok=True)
    again = [t for t in sweep.study.get_trials(deepcopy=False) if t.user_attrs.get("outcome") == "cancelled"
             and t.number not in (meta.get("requeued") or [])]
    for t in again:  # cancelled with the sweep (Ctrl-C, sweep.cancel()): their values run again
        sweep.study.enqueue_trial(dict(t.params), skip_if_exists=False)
        sweep.say(f"trial {t.number} queued again: it was cancelled with the sweep")
    sweep.dir.update_meta(finished=None, cancelled=None,
                          requeued=[*(meta.get("requeued") or []), *(t.number for t in again)])
    for t in sweep.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        _take_over(sweep, t)


def _take_over(sweep: Sweep, t: Any) -> None:
    """Follow again the run of trial `t`, RUNNING in the study when its driver went, or queue its
    values again: a driver killed after Optuna's ask and before the values leaves a trial with
    none (its grid point is found from the sampler's record, else a sampled search asks afresh)."""
    import optuna

    trial = optuna.trial.Trial(sweep.study, t._trial_id)
    run_dir = sweep.run_dir_of(t)
    run = _loaded(run_dir)
    job_id = str(run.meta.get("job_id") or "") if run is not None else ""
    orphan = unrecorded_controller(run.dir) if run is not None and not job_id else None
    if run is not None and orphan is not None:  # started, the driver killed before it noted the job
        run.dir.record_job(str(orphan.pid), controller=orphan.to_dict())
        finish_submission(run.dir, str(orphan.pid))  # or before submitit named its pickle
        run, job_id = Run.load(run.folder), str(orphan.pid)
    if run is not None and not job_id:  # the old driver stopped while starting it
        run.dir.mark_cancelled(f"sweep {sweep.name}: its driver stopped while starting this trial's run; "
                               "the trial was queued again")
        run = None
    if run is not None and sweep.arrays is not None and sweep.arrays.hand_over_again(job_id, run.dir, t.number):
        state = "handed to its element"  # prepared, its element still waiting for the answer
    else:
        state = run.status().state if run is not None else "never started"
    if run is not None and state not in ("failed", "cancelled"):
        last = max(t.intermediate_values, default=-1)
        sweep.active[t.number] = Active(trial, run, float(t.user_attrs.get("submitted") or time.time()),
                                        reported=last, last=t.intermediate_values.get(last))
        sweep.say(f"trial {t.number} followed again ({state}): {run_dir}")
        return
    trial.set_user_attr("outcome", "requeued")
    sweep.study.tell(trial, state=state_named("FAIL"))
    values = trial_values(sweep.study, t, sweep.space)
    if values is not None:
        sweep.study.enqueue_trial(values, skip_if_exists=False)
    sweep.say(f"trial {t.number} queued again: its run {state} with the old driver")


def trial_values(study: Any, t: Any, space: dict[str, Any]) -> dict[str, Any] | None:
    """The values trial `t` was to run: its params once suggested; before that, those it was enqueued
    with, or its grid point, as the study's GridSampler gives it for the point it recorded on the
    trial (grid_id; the sampler orders its grid by its seed); None for a sampled trial."""
    import optuna

    if set(t.params) >= set(space):
        return dict(t.params)
    fixed = t.system_attrs.get("fixed_params")
    if isinstance(fixed, dict) and set(fixed) >= set(space):
        return dict(fixed)
    sampler = study.sampler
    if "grid_id" in t.system_attrs and isinstance(sampler, optuna.samplers.GridSampler):
        return {f: sampler.sample_independent(study, t, f, optuna.distributions.CategoricalDistribution(v))
                for f, v in space.items() if isinstance(v, list)}
    return None


def _loaded(run_dir: Path | None) -> Run | None:
    if not run_dir:
        return None
    try:
        return Run.load(run_dir)
    except RunFolderError:
        return None


def sweep_row(folder: SweepDir) -> dict[str, Any]:
    meta = folder.read_meta() or {}
    row: dict[str, Any] = {"name": folder.root.name, "folder": str(folder.root), "created": meta.get("created"),
                           "metric": meta.get("metric"), "direction": meta.get("direction"),
                           "trials": meta.get("trials"), "driving": driving(meta), "executor": meta.get("executor")}
    try:
        import optuna

        from workbench.sweeps.study import optuna_module, storage

        optuna_module()
        study = optuna.load_study(study_name="sweep", storage=storage(folder))
        found = study.get_trials(deepcopy=False)
    except Exception:  # noqa: BLE001 - one unreadable sweep must not hide the others
        return row
    done = [t for t in found if t.state.is_finished() and counted(t)]
    complete = [t for t in found if t.state.name == "COMPLETE"]
    row["done"] = len(done)
    if complete:
        best = study.best_trial
        row.update(best=best.value, best_trial=best.number)
    return row


def metric_values(run: Run, metric: str) -> list[tuple[int, float]]:
    """(step, value) of `metric` in the run so far: an eval metric from its eval events, a logged one
    reduced across ranks (`<metric>_reduced` where the ranks reduce it) from its metrics records."""
    frame = run.evals() if metric.startswith("val_") else run.metrics()
    if metric not in frame and metric.startswith("val_"):  # a function or script logs its own (workbench.log)
        frame = run.metrics()
    if not len(frame) or metric not in frame or "step" not in frame:
        return []
    column = f"{metric}_reduced" if f"{metric}_reduced" in frame else metric
    rows = frame[["step", column]].dropna()
    if "rank" in frame and column == metric and metric != "step":
        rows = frame.loc[frame["rank"] == 0, ["step", column]].dropna()
    per_step = rows.groupby("step")[column].last()
    return [(int(s), float(v)) for s, v in per_step.items()]


BOOKKEEPING = ("rank", "step", "time", "wall_time", "elapsed_s", "samples", "attempt", "epoch", "event")


def missing_metric(run: Run, metric: str) -> str:
    """Why a finished trial has no value: one line naming the metric and what its run did log."""
    logged = [c for c in run.metrics().columns if c not in BOOKKEEPING and not c.endswith("_reduced")]
    logged += [c for c in run.evals().columns if c.startswith("val_") and c not in logged]
    if not logged:
        return (f"its run finished without logging any metric ({metric} is the sweep's); log it on rank 0 "
                f"with workbench.log(step=..., {metric}=value)")
    return (f"its run finished without logging {metric} (it logged {', '.join(logged)}); set metric= to one "
            f"of them, or log {metric} with workbench.log(step=..., {metric}=value)")


def list_sweeps(root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """One row per sweep folder under `root` (default: WORKBENCH_RUN_ROOT or runs/): name, folder,
    created, metric, direction, trials done of planned, best value and trial, driver alive."""
    import pandas as pd

    from workbench.launch.history import default_root

    rows = [sweep_row(d) for d in sweeps_under(root if root is not None else default_root())]
    frame = pd.DataFrame(rows, columns=["name", "folder", "created", "metric", "direction", "done", "trials",
                                        "best", "best_trial", "driving", "executor"])
    frame["created"] = pd.to_datetime(frame["created"], unit="s", utc=True, errors="coerce")
    return frame
