"""A sweep's trials on SLURM: one job array (submitit's array submission, sbatch --array=0-N%P with
`parallel` as P), the study still in the driver (the submitting process).

Elements are bound late.  TPE samples a trial's values from the trials before it, so an element is
not given its values when the array is submitted: it starts, says so (a "waiting" marker in the
sweep folder, workbench.engine.sweep_element), and the driver, at its next poll, asks Optuna for a
trial, prepares the trial's run folder (config, task, run.json with the element's job id JOB_I)
and answers the element with it; the element's ranks then run that trial as an ordinary run (its
own folder, dashboard, logs and Run handle).  An element that starts when nothing is left to run
is answered "nothing" and ends.

One array per resource shape: SLURM gives every element of an array the same resources, so trials
whose sbatch resources differ (a swept dist.procs_per_node, dist.nodes, launch.time_limit or
launch.slurm.*) cannot share one.  A grid gets one array per shape, each holding that shape's
points, the arrays chained (each starts once the one before it ended: --dependency=afterany) so
that at most `parallel` elements run at once; a sampled space must keep one shape (such fields as
a grid list, or one sweep per value: checked before anything starts).

Pruning cancels the trial's element alone (scancel JOB_I); Sweep.cancel() cancels the arrays
(scancel JOB), queued elements included; when the sweep is done, elements still queued are
cancelled.  Sweep.load resumes: elements still queued or waiting are answered by the new driver,
runs still going are followed, and an array is submitted again only for work no live element can
take (the queue is read with squeue at most every REPLAN_EVERY_S)."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.sections import JobConfig
from workbench.errors import SubmitError
from workbench.launch.executors import SlurmJob, slurm_array_executor, slurm_failure, slurm_shape
from workbench.launch.submit import Launches
from workbench.runfolder.layout import RunDir, SweepDir, write_json_atomic
from workbench.runfolder.private import private_umask
from workbench.sweeps import space as sp

if TYPE_CHECKING:
    from workbench.sweeps.driver import Sweep

REPLAN_EVERY_S = 15.0
"""How often the driver compares the work left with the elements still queued (one squeue)."""
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
        "RESIZING", "SIGNALING", "STAGE_OUT"}
"""SLURM job states of an element that may still start or run a trial."""


def shape_key(cfg: JobConfig) -> str:
    return json.dumps(slurm_shape(cfg), sort_keys=True, default=str)


def slurm_space_problems(cfg: JobConfig, space: dict[str, Any]) -> list[str]:
    """A sampled space on SLURM is one job array: a field whose values change what sbatch asks
    (nodes, tasks, time, partition, ...) must be a grid instead."""
    if cfg.launch.executor != "slurm" or sp.is_grid(space):
        return []
    base, problems = shape_key(sp.apply_params(cfg, {f: _first(v) for f, v in space.items()})), []
    for field, values in space.items():
        corners = values if isinstance(values, list) else values.corners()
        if any(shape_key(sp.apply_params(cfg, {f: _first(v) for f, v in space.items()} | {field: c})) != base
               for c in corners):
            problems.append(f"space[{field!r}]: on SLURM a sampled sweep's trials are one job array, whose elements "
                            "all get the same resources; give every field that changes them as a list with no "
                            "distribution in the space (a grid: one array per shape), or run one sweep per value")
    return problems


def _first(values: Any) -> Any:
    return values[0] if isinstance(values, list) else values.corners()[0]


class SlurmArrays:
    """The driver's side of a SLURM sweep: its arrays (in sweep.json, `arrays`) and the answers to
    its waiting elements."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.checked = float("-inf")
        """When the queue was last compared with the work left (time.monotonic())."""
        self.unanswered: str | None = None
        """What SLURM said when the queue could not be read (said once, then read again later)."""

    @property
    def dir(self) -> SweepDir:
        return self.sweep.dir

    def records(self) -> list[dict[str, Any]]:
        """Every array of the sweep: job id, size, shape key, when submitted."""
        return list((self.dir.read_meta() or {}).get("arrays") or [])

    def step(self) -> None:
        """Submit an array for work no live element will take; answer every waiting element."""
        if time.monotonic() - self.checked >= REPLAN_EVERY_S:
            self.plan()
        for job_id in self.dir.waiting_elements():
            if not self.dir.element(job_id, "bound").exists():
                self._bind(job_id)

    # --- arrays ------------------------------------------------------------------------------
    def plan(self) -> None:
        self.checked = time.monotonic()
        records = self.records()
        try:
            live = live_elements([r["job_id"] for r in records]) if records else set()
        except SubmitError as exc:  # SLURM does not answer now: elements that wait are still answered
            if str(exc) != self.unanswered:
                self.sweep.say(f"{exc} (read again every {REPLAN_EVERY_S:.0f} s)")
            self.unanswered = str(exc)
            return
        self.unanswered = None
        capacity = Counter(r["shape"] for r in records for e in _elements(r)
                           if e in live and not self.dir.element(e, "bound").exists())
        self._check_started(records, live)
        after = sorted({r["job_id"] for r in records if live & set(_elements(r))})
        for key, (cfg, count) in self._todo().items():
            if count > capacity[key]:
                after.append(self._submit(cfg, key, count - capacity[key], after))

    def _todo(self) -> dict[str, tuple[JobConfig, int]]:
        """Shape key -> (a config of that shape, trials of that shape still to run)."""
        sweep, taken = self.sweep, self._taken()
        if sp.is_grid(sweep.space):
            out: dict[str, tuple[JobConfig, int]] = {}
            for point in sp.grid_points(sweep.space):
                if _frozen(point) not in taken:
                    cfg = sp.apply_params(sweep.cfg, point)
                    key = shape_key(cfg)
                    out[key] = (cfg, out.get(key, (cfg, 0))[1] + 1)
            return out
        cfg = sp.apply_params(sweep.cfg, {f: _first(v) for f, v in sweep.space.items()})
        left = sweep.trials - sum(1 for t in self._counted() if t.state.name != "WAITING")
        return {shape_key(cfg): (cfg, left)} if left > 0 else {}

    def _counted(self) -> list[Any]:
        from workbench.sweeps.views import counted

        return [t for t in self.sweep.study.get_trials(deepcopy=False) if counted(t)]

    def _taken(self) -> set[tuple[Any, ...]]:
        """The grid points a trial ran, runs or was given up on (not those queued again)."""
        return {_frozen(t.params or t.system_attrs.get("fixed_params") or {}) for t in self._counted()
                if t.state.name != "WAITING"}

    def _submit(self, cfg: JobConfig, key: str, size: int, after: list[str]) -> str:
        from workbench.engine.rendezvous import RankContract
        from workbench.engine.sweep_element import SweepElement

        sweep = self.sweep
        element = SweepElement(str(self.dir.root), RankContract(local=False), cfg.launch.max_restarts)
        with private_umask():
            executor = slurm_array_executor(cfg, self.dir.arrays, sweep.parallel, after, sweep.name)
            jobs = executor.submit_array([element] * size)
        job_id = str(jobs[0].job_id).split("_", 1)[0]
        self.dir.update_meta(arrays=[*self.records(), {"job_id": job_id, "size": size, "shape": key,
                                                       "after": list(after), "submitted": time.time()}])
        sweep.say(f"SLURM job array {job_id}_[0-{size - 1}%{min(size, sweep.parallel)}] submitted: {size} "
                   f"elements, {sweep.parallel} at once" + (f", after {', '.join(after)}" if after else ""))
        return job_id

    def _check_started(self, records: list[dict[str, Any]], live: set[str]) -> None:
        """An element that left the queue without ever saying it started died before the trial
        (its sbatch setup, or Python on the node): raised, naming its log, instead of resubmitting."""
        for r in records:
            for job_id in _elements(r):
                if job_id not in live and not r.get("released") and not self.dir.element(job_id, "waiting").exists():
                    log = self.dir.array_task_file(job_id, 0, "log.err")
                    raise SubmitError(f"sweep {self.dir.root}: SLURM array element {job_id} ended before it started "
                                      f"a trial; see {log} and sacct -j {job_id}")

    def release(self, strict: bool = True) -> None:
        """The sweep is over: what is left of the arrays ends.  On a cancel (`strict`) every element is
        cancelled.  At the sweep's end only the queued ones are, and one that started and waits is
        answered "nothing": an element still running has just ended its trial and exits by itself (a
        scancel of the whole array then made that finished trial's element CANCELLED in sacct).  When
        SLURM does not answer, sweep.json already says the sweep is over, so the elements end as they
        start: raised (`strict`) or said (the end of the sweep)."""
        records = [r for r in self.records() if not r.get("released")]
        if not records:
            return
        ids = [r["job_id"] for r in records]
        try:
            live = live_elements(ids)
            if strict:
                scancel([r["job_id"] for r in records if live & set(_elements(r))])
            else:
                for job_id in sorted(live):
                    if self.dir.element(job_id, "waiting").exists() and not self.dir.element(job_id, "bound").exists():
                        self.answer(job_id, None, "nothing left to run")
                scancel([r["job_id"] for r in records if live & set(_elements(r))], pending_only=True)
        except SubmitError as exc:
            said = (f"{exc}; the sweep's elements still queued end as they start (sweep.json says it is over); "
                    f"scancel {' '.join(ids)} once SLURM answers")
            if strict:
                raise SubmitError(said) from None
            return self.sweep.say(said)
        released = {r["job_id"] for r in records}
        self.dir.update_meta(arrays=[{**r, "released": time.time()} if r["job_id"] in released else r
                                     for r in self.records()])

    # --- answers -----------------------------------------------------------------------------
    def _bind(self, job_id: str) -> None:
        """Answer element `job_id`: the run folder of a trial of its shape, or nothing."""
        record = next((r for r in self.records() if job_id.split("_", 1)[0] == r["job_id"]), None)
        sweep = self.sweep
        if record is None or not sweep.wants_trial():
            return self.answer(job_id, None, "nothing left to run")
        claimed = self._claim(record["shape"])
        if claimed is None:
            return self.answer(job_id, None, "no trial of this element's resources is left")
        sweep.start_trial(claimed, launcher=Element(self, job_id))
        if not self.dir.element(job_id, "bound").exists():  # its run could not start (said as the trial's)
            self.answer(job_id, None, "its trial could not start")

    def _claim(self, key: str) -> Any:  # an optuna.Trial, or None
        """A trial of shape `key`, RUNNING: for a grid, one queued again or the next point left;
        else Optuna's next (TPE samples it now, from every result so far)."""
        import optuna

        study = self.sweep.study
        if not sp.is_grid(self.sweep.space):
            return study.ask()
        trial_id = self._waiting_of(key)
        trial_id = self._next_point(key) if trial_id is None else trial_id
        return None if trial_id is None else optuna.Trial(study, trial_id)

    def _waiting_of(self, key: str) -> int | None:
        """Claim the oldest trial queued again (Sweep.load) whose point has shape `key`."""
        study = self.sweep.study
        for t in study.get_trials(deepcopy=False, states=(_state("WAITING"),)):
            point = t.system_attrs.get("fixed_params") or {}
            if shape_key(sp.apply_params(self.sweep.cfg, point)) == key and _claimed(study, t._trial_id):
                return int(t._trial_id)
        return None

    def _next_point(self, key: str) -> int | None:
        """Queue the next grid point of shape `key` no trial has, and claim it."""
        sweep, taken = self.sweep, self._taken()
        for point in sp.grid_points(sweep.space):
            if _frozen(point) not in taken and shape_key(sp.apply_params(sweep.cfg, point)) == key:
                sweep.study.enqueue_trial(point, skip_if_exists=False)
                return self._waiting_of(key)
        return None

    def hand_over_again(self, job_id: str, run: RunDir, trial: int) -> bool:
        """Sweep.load: a trial's run prepared for element `job_id` (JOB_I, recorded in its run.json)
        that the old driver stopped before answering, the element still waiting, is answered now (True)."""
        if self.dir.element(job_id, "bound").exists() or not self.dir.element(job_id, "waiting").exists():
            return False
        self.answer(job_id, run, trial=trial)
        return True

    def answer(self, job_id: str, run: RunDir | None, why: str = "", trial: int | None = None) -> None:
        self.dir.elements.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(self.dir.element(job_id, "bound"), {"run_dir": str(run.root) if run else None, "why": why,
                                                              "trial": trial, "time": time.time()})


def _elements(record: dict[str, Any]) -> list[str]:
    """The job ids JOB_I of an array's elements."""
    return [f"{record['job_id']}_{i}" for i in range(int(record["size"]))]


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


def _claimed(study: Any, trial_id: int) -> bool:
    """Move a queued trial to RUNNING, as Study.ask does (False if another process took it)."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        return bool(study._storage.set_trial_state_values(trial_id, state=_state("RUNNING")))
    except UpdateFinishedTrialError:
        return False


def _frozen(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, json.dumps(v, default=str)) for k, v in params.items()))


class Element(Launches):
    """Where a trial's prepared run folder goes on SLURM: to array element `job_id`, which already
    runs and waits; handing it over is answering the element.  Submits as workbench.submit,
    submit_fn and submit_script do (the same pipeline), as a Pool does."""

    def __init__(self, arrays: SlurmArrays, job_id: str):
        self.arrays, self.job_id = arrays, job_id

    def hand_over(self, cfg: JobConfig, run: RunDir, stop_with_caller: bool) -> SlurmJob:
        for task in range(cfg.world_size):  # submitit's per-task files, where the run's readers look
            for what in ("log.out", "log.err", "result.pkl"):
                link = run.task_file(self.job_id, task, what)
                if not link.is_symlink() and not link.exists():
                    link.symlink_to(self.arrays.dir.array_task_file(self.job_id, task, what))
        run.record_job(self.job_id, sweep_array=self.job_id.split("_", 1)[0])
        self.arrays.answer(self.job_id, run, trial=_trial_number(run.root))
        return SlurmJob(folder=run.logs, job_id=self.job_id, tasks=tuple(range(cfg.world_size)))


def _trial_number(root: Path) -> int | None:
    tail = root.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def live_elements(array_ids: list[str]) -> set[str]:
    """The elements (JOB_I) of these arrays that may still start or run, from squeue; a failing
    squeue is one SubmitError line in SLURM's words (the driver must not submit blind)."""
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(array_ids), "-o", "%i %T"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmitError(f"squeue did not run: {exc}; run the sweep from a cluster login node") from None
    if done.returncode and "invalid job id" in (done.stderr or "").lower():
        return set()  # every array has left the queue
    if done.returncode:
        said = "; ".join(line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip())
        raise SubmitError(f"squeue failed (exit {done.returncode}): {said or 'no message'}; the sweep cannot tell "
                          "which of its array elements are queued: check that `squeue` works here")
    pairs = (line.split() for line in done.stdout.splitlines() if line.strip())
    return {p[0] for p in pairs if len(p) == 2 and p[1] in LIVE}


def scancel(job_ids: list[str], pending_only: bool = False) -> None:
    """Cancel these jobs or array elements (an array's id: every element, queued ones included; with
    `pending_only` the queued ones alone); one that ended meanwhile is no failure."""
    if not job_ids:
        return
    command = ["scancel", *(["--state=PENDING"] if pending_only else []), *job_ids]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmitError(f"scancel {' '.join(job_ids)} did not run: {exc}; cancel them with scancel on a "
                          "login node") from None
    said = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode and not (said and all(_ended_meanwhile(line) for line in said)):
        raise SubmitError(slurm_failure(f"scancel {' '.join(job_ids)}", done.stderr or done.stdout, done.returncode))



def _ended_meanwhile(said: str) -> bool:
    low = said.lower()
    return "already completing or completed" in low or "invalid job id" in low
