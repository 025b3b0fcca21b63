"""The one place that knows the layout of a run folder.

    <run>/config.yaml            the config snapshot
    <run>/run.json               launch facts: executor, job id, world size, created
    <run>/payload.pkl            the run's payload: the task factory, script or function the ranks run
    <run>/metrics/rank{R}.jsonl  one flat record per logged step, per rank
    <run>/events/rank{R}.jsonl   start, epoch_end, eval, checkpoint, early_stop, error, end, ...
                                 (the kinds: workbench.runfolder.events)
    <run>/status/rank{R}.json    heartbeat: state, step, time (replaced atomically)
    <run>/errors/rank{R}.json    the failing rank's exception and traceback
    <run>/errors/failure-{N}/    error files of a failed attempt that was restarted
    <run>/errors/controller.json a local run's controller that died
    <run>/errors/torchelastic/rank{R}.json  what torch's @record wrote (TORCHELASTIC_ERROR_FILE)
    <run>/results/rank{R}.pkl    what a function run returned on each rank
    <run>/procs/rank{R}.json     the rank's agent and worker processes (pid, process group, start)
    <run>/stacks/rank{R}.txt     Python stacks of a stalled rank
    <run>/logs/                  submitit's per-task stdout/stderr and pickles, the controller's log,
                                 rank{R}.log: a rank's stdout and stderr interleaved as written
    <run>/checkpoints/           step-{N}.pt files written by rank 0 (ddp), or step-{N}/ folders
                                 every rank writes a shard of (fsdp2); set-aside-{stamp}/: put away
    <run>/summary.json           written at the end of the run
    <run>/plots/loss.png         the per-rank loss plot `workbench run` saves
    <run>/rendezvous/            where rank 0 publishes its port (SLURM; every restart), and where
                                 the agents mark their workers down before a restart
    <run>/tensorboard/rank{R}/   TensorBoard event files (when log.tensorboard mirrors live)
    <run>/wandb/                 W&B's files (when log.wandb mirrors live)
    <run>/exports/               metrics as CSV or Parquet (Run.export_metrics)
    <run>/row.json               the run's row in workbench.runs(), kept once the run ended, with the
                                 sizes and times of the files it was read from (valid while they hold)

Creating one (the name under run_root, the private tree, the config snapshot and run.json) lives
here too, so the submitting side and ``python -m workbench.train`` under torchrun write the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.proctree import Proc
from workbench.runfolder import records
from workbench.runfolder.private import DIR_MODE, make_dirs, open_private, write_atomic

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig

RANK_KINDS = ("metrics", "events", "status", "errors", "stacks", "results", "procs")
"""Folders holding one file per rank."""
RANK_JSONL = "rank*.jsonl"
"""The per-rank JSON-lines files of a metrics or events folder (rank_of reads R from the name)."""


def user_cache(name: str) -> Path:
    """$XDG_CACHE_HOME/workbench/<name> (default ~/.cache/workbench): what this user's machine measured
    once and keeps (the plan's link probe: links.json)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "workbench" / name


PAYLOAD = "payload.pkl"
"""What a run executes beyond what its config says (its payload: a task factory passed as a Python
object, a user's function with its arguments, or a script with its own), cloudpickled; in a sweep
folder, the swept factory or function.  Folders written before the word read as they were: task.pkl."""

OLD_PAYLOAD = "task.pkl"


def payload_file(root: Path) -> Path:
    """root/payload.pkl, or root/task.pkl where a folder written before the word has only that."""
    new, old = root / PAYLOAD, root / OLD_PAYLOAD
    return old if not new.exists() and old.exists() else new


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def meta(self) -> Path:
        return self.root / "run.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def controller_log(self) -> Path:
        """Output of a local run's controller (workbench.launch.local_controller)."""
        return self.root / "logs" / "controller.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def loss_plot(self) -> Path:
        """The per-rank loss plot `workbench run` saves at the end."""
        return self.plots / "loss.png"

    @property
    def plan(self) -> Path:
        """plan.json: what workbench.plan predicted for this run, kept by run.plan() (launch.plancheck)."""
        return self.root / "plan.json"

    @property
    def payload_pickle(self) -> Path:
        """payload.pkl: what the run executes, beyond what its config says (workbench.runfolder.layout.PAYLOAD)."""
        return payload_file(self.root)

    def folder(self, kind: str) -> Path:
        """The folder of one kind of per-rank file (metrics, events, status, errors, stacks)."""
        return self.root / kind

    def metrics(self, rank: int) -> Path:
        return self.root / "metrics" / f"rank{rank}.jsonl"

    def events(self, rank: int) -> Path:
        return self.root / "events" / f"rank{rank}.jsonl"

    def status(self, rank: int) -> Path:
        return self.root / "status" / f"rank{rank}.json"

    def error(self, rank: int) -> Path:
        return self.root / "errors" / f"rank{rank}.json"

    def result(self, rank: int) -> Path:
        """What a function run with workbench.submit_fn returned on this rank (cloudpickle)."""
        return self.root / "results" / f"rank{rank}.pkl"

    def pool_log(self, job: int, rank: int, suffix: str) -> Path:
        """The rank's stdout ("out") or stderr ("err") while a warm pool ran this folder as its job
        number `job` (log_files finds it)."""
        return self.root / "logs" / f"pool-job{job}_{rank}_log.{suffix}"

    @property
    def controller_error(self) -> Path:
        """The record of a run's controller that died (workbench.runfolder.failures)."""
        return self.root / "errors" / "controller.json"

    def elastic_error(self, rank: int) -> Path:
        """The rank's TORCHELASTIC_ERROR_FILE: where torch's @record writes the error of a script's
        entry point, which the rank's agent reads into its failure when the rank wrote none."""
        return self.root / "errors" / "torchelastic" / f"rank{rank}.json"

    def both_streams(self, rank: int) -> Path:
        """The rank's stdout and stderr interleaved, each line as its agent received it (Run.logs)."""
        return self.root / "logs" / f"rank{rank}.log"

    def error_reserve(self, rank: int) -> Path:
        """Room set aside for the rank's error file, used when the disk is full (workbench.runfolder.failures)."""
        return self.root / "errors" / f".rank{rank}.reserve"

    def archived_errors(self) -> list[dict[int, Path]]:
        """rank -> error file of each failed attempt that was restarted, oldest first."""
        folder = self.folder("errors")
        found = [p for p in folder.glob("failure-*") if p.name[8:].isdigit()] if folder.is_dir() else []
        return [self.rank_files_in(p) for p in sorted(found, key=lambda p: int(p.name[8:]))]

    def archive_errors(self) -> None:
        """Move the current error files under errors/failure-{N}/ (N = 1, 2, ...): the next attempt
        starts clean and the failure stays on record."""
        target = self.folder("errors") / f"failure-{len(self.archived_errors()) + 1}"
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in self.rank_files("errors").values():
            os.replace(path, target / path.name)

    def procs(self, rank: int) -> Path:
        return self.root / "procs" / f"rank{rank}.json"

    def recorded(self, role: str) -> list[Proc]:
        """Every rank's "agent" or "worker" process as its agent recorded it in procs/rank{R}.json."""
        return [proc for _, proc in self.named(role)]

    def named(self, role: str) -> list[tuple[Path, Proc]]:
        """The processes of `role` this folder names, each with the file naming it: the "controller"
        (run.json, pool.json: pid, process group, start), or every rank's "agent" or "worker"
        (procs/rank{R}.json).  Input like any file here: workbench.launch.ours checks it before a signal."""
        if role == "controller":
            meta = self.read_meta() or {}
            proc = Proc.from_dict(meta.get("controller"))
            job_id = str(meta.get("job_id") or "")
            if proc is None and meta.get("executor") == "local" and job_id.isascii() and job_id.isdigit():
                proc = Proc(int(job_id))  # a local job's id is its controller's pid (start time unknown)
            found = [(self.meta, proc)]
        else:
            found = [(path, Proc.from_dict((read_json(path) or {}).get(role)))
                     for path in self.rank_files("procs").values()]
        return [(path, proc) for path, proc in found if proc is not None]

    def stacks(self, rank: int) -> Path:
        return self.root / "stacks" / f"rank{rank}.txt"

    def tensorboard(self, rank: int) -> Path:
        """The rank's TensorBoard event files (the live mirror, log.tensorboard)."""
        return tensorboard_rank(self.root / "tensorboard", rank)

    @property
    def wandb(self) -> Path:
        """W&B's own files (the live mirror, log.wandb)."""
        return self.root / "wandb"

    @property
    def exports(self) -> Path:
        """Metrics exported as CSV or Parquet (Run.export_metrics, the dashboard's download)."""
        return self.root / "exports"

    @property
    def row_cache(self) -> Path:
        """The run's row in workbench.runs(), written once the run ended (workbench.launch.history)."""
        return self.root / "row.json"

    def export(self, fmt: str) -> Path:
        """Where Run.export_metrics writes by default: exports/metrics.{fmt}."""
        return self.exports / f"metrics.{fmt}"

    def checkpoint(self, step: int) -> Path:
        """Step N's checkpoint as rank 0 writes it under ddp: one file, the whole state."""
        return self.checkpoints / f"step-{step:08d}.pt"

    def sharded_checkpoint(self, step: int) -> Path:
        """Step N's checkpoint under fsdp2: a torch.distributed.checkpoint folder, a shard file a rank
        plus `.metadata`, and `trainer.pt` (step, schedule, RNG states, config) from rank 0."""
        return self.checkpoints / f"step-{step:08d}"

    def checkpoint_files(self) -> list[Path]:
        """Finished checkpoints of either kind, oldest first (temp files and folders are never listed)."""
        if not self.checkpoints.is_dir():
            return []
        found = [p for p in self.checkpoints.glob("step-*") if _STEP.fullmatch(p.name)]
        return sorted(found, key=lambda p: (checkpoint_step(p), p.suffix))

    def checkpoint_temp(self, step: int, pid: int) -> Path:
        """Where process `pid` writes step N's checkpoint before renaming it (never listed as one)."""
        return self.checkpoints / f".step-{step:08d}.pt.tmp-{pid}"

    def sharded_checkpoint_temp(self, step: int) -> Path:
        """Where all ranks write step N's sharded checkpoint before rank 0 renames the folder."""
        return self.checkpoints / f".step-{step:08d}.partial"

    def checkpoint_temps(self) -> list[Path]:
        """Checkpoint temp files and folders: a writer killed mid-write leaves its own behind."""
        if not self.checkpoints.is_dir():
            return []
        return sorted([*self.checkpoints.glob(".step-*.pt.tmp-*"), *self.checkpoints.glob(".step-*.partial")])

    def set_aside(self, stamp: str) -> Path:
        """Where a fresh start puts the checkpoints it will not resume from (checkpoints/set-aside-{stamp})."""
        return self.checkpoints / f"set-aside-{stamp}"

    # --- where ranks meet (engine.rendezvous, the agents' regroup barrier, engine.supervisor) ------
    @property
    def rendezvous_folder(self) -> Path:
        return self.root / "rendezvous"

    def rendezvous(self, key: str) -> Path:
        """The meeting `key`: the host and port rank 0 published (and what else it agreed)."""
        return self.rendezvous_folder / f"{key}.json"

    def down_mark(self, key: str, rank: int) -> Path:
        """Rank R's worker is down, waiting for the meeting `key`."""
        return self.rendezvous_folder / f"{key}-down-rank{rank}.json"

    def mark_down(self, key: str, rank: int) -> None:
        """Say that rank R's worker is down for the meeting `key` (the regroup barrier, a pool's next generation)."""
        write_json_atomic(self.down_mark(key, rank), {"time": time.time()})

    def ranks_down(self, key: str, world_size: int) -> set[int]:
        """The ranks whose worker is down for the meeting `key`."""
        return {rank for rank in range(world_size) if self.down_mark(key, rank).exists()}

    @staticmethod
    def start_key(job_id: str, requeue: int) -> str:
        """The meeting of a job's ranks when they start (its requeue-th time): the SLURM port."""
        return f"{job_id}-{requeue}"

    @staticmethod
    def restart_key(start_key: str, restart: int) -> str:
        """The meeting after the restart-th failure (launch.max_restarts) of the job started at `start_key`."""
        return f"{start_key}-restart{restart}"

    @staticmethod
    def port_retry_key(attempt_key: str, retry: int) -> str:
        """The meeting on a fresh port after the one of `attempt_key` was taken before the ranks met."""
        return f"{attempt_key}-port{retry}"

    def task_file(self, job_id: str, task: int, what: str) -> Path:
        """Where submitit writes task `task`'s "log.out", "log.err" or "result.pkl" of job `job_id`."""
        return self.logs / f"{job_id}_{task}_{what}"

    def log_files(self, rank: int, suffix: str) -> list[Path]:
        """The rank's stdout ("out") or stderr ("err") files, one per attempt (submitit names them)."""
        return sorted(self.logs.glob(f"*_{rank}_log.{suffix}"))

    def rank_files(self, kind: str) -> dict[int, Path]:
        """rank -> its file of `kind` (metrics, events, status, errors, stacks, procs), for files that exist."""
        return self.rank_files_in(self.folder(kind))

    @staticmethod
    def rank_files_in(folder: Path) -> dict[int, Path]:
        if not folder.is_dir():
            return {}
        found = {rank: p for p in folder.iterdir() if (rank := rank_of(p)) is not None}
        return dict(sorted(found.items()))

    def ranks_with(self, kind: str) -> list[int]:
        """Ranks that have a file of `kind` (metrics, events, status, errors)."""
        return list(self.rank_files(kind))

    # --- reading what the ranks wrote (workbench.runfolder.records: damaged content reads as absent) ---------
    def read_meta(self) -> dict[str, Any] | None:
        """run.json (None when absent or damaged); fields of the wrong type are left out."""
        return records.read_object(self.meta, records.META)

    def read_status(self, rank: int) -> dict[str, Any] | None:
        """The rank's heartbeat: state and time always there; None when absent or damaged."""
        return records.read_object(self.status(rank), records.STATUS)

    def read_error(self, rank: int) -> dict[str, Any] | None:
        """The rank's error record (None when absent or damaged)."""
        return records.read_object(self.error(rank), records.ERROR)

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json (None when absent or damaged)."""
        return records.read_object(self.summary, records.SUMMARY)

    # --- a run folder's life ---------------------------------------------------------------------
    def create(self) -> RunDir:
        """Make the folder tree, private to the user (0700 whatever the umask): submitit keeps
        pickles here.  Missing parents (the run root) are made 0700 too."""
        make_dirs(self.root)
        for sub in ("", *RANK_KINDS, "logs", "checkpoints", "plots", "rendezvous"):
            make_dirs(self.root / sub)
            os.chmod(self.root / sub, DIR_MODE)
        return self

    def prepare(self, cfg: JobConfig, executor: str, **facts: Any) -> RunDir:
        """Create the tree, write config.yaml and run.json; a folder used again keeps its start time
        and its metrics, events, logs and checkpoints, but forgets how the last attempt ended."""
        self.create()
        write_atomic(self.config, cfg.to_yaml().encode())

        def fill(meta: dict[str, Any]) -> None:
            if meta:
                self.forget_last_attempt(meta)
            meta.update({"executor": executor, "world_size": cfg.world_size, "nodes": cfg.dist.nodes,
                         "procs_per_node": cfg.dist.procs_per_node, "user": getpass.getuser(),
                         "submit_host": socket.gethostname(), **facts})
            meta.setdefault("created", time.time())

        self.update_meta(fill)
        return self

    def forget_last_attempt(self, meta: dict[str, Any]) -> None:
        """Errors, statuses, stacks, process records, results, meeting points, summary and the cancel
        and prune marks go; metrics, events, logs, checkpoints and earlier attempts' errors stay."""
        for kind in ("errors", "status", "stacks", "procs", "results"):
            for path in self.rank_files(kind).values():
                path.unlink(missing_ok=True)
        for path in self.rendezvous_folder.glob("*.json"):
            path.unlink(missing_ok=True)
        self.summary.unlink(missing_ok=True)
        for key in ("cancelled", "cancelled_by", "pruned", "job_id", "controller", "pool"):
            meta.pop(key, None)

    @contextlib.contextmanager
    def locked(self, what: str = "meta") -> Iterator[None]:
        """Hold one of the run folder's locks: "meta" (run.json read-modify-write) or "submit" (one
        submission at a time)."""
        make_dirs(self.root)  # 0700, parents made here too, whatever the umask
        with open_private(self.root / f".{what}.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def update_meta(self, change: Callable[[dict[str, Any]], None] | None = None, **fields: Any) -> dict[str, Any]:
        """Change run.json under the folder's lock (the submitter, the ranks and a cancel may all
        write it); returns the new contents."""
        with self.locked():
            meta = self.read_meta() or {}
            if change is not None:
                change(meta)
            meta.update(fields)
            write_json_atomic(self.meta, meta)
        return meta

    def record_job(self, job_id: str, **facts: Any) -> None:
        """Note the scheduler's job id in run.json, so Run.load can reattach to the job later."""

        def add(meta: dict[str, Any]) -> None:
            earlier = meta.get("job_ids")
            meta.update({"job_id": str(job_id), **facts})
            meta["job_ids"] = [*(earlier if isinstance(earlier, list) else []), str(job_id)]

        self.update_meta(add)

    def mark_cancelled(self, by: str) -> None:
        """Note that the run was stopped on purpose (it is reported as cancelled, not failed)."""

        def mark(meta: dict[str, Any]) -> None:
            if "cancelled" not in meta:
                meta.update(cancelled=time.time(), cancelled_by=by)

        self.update_meta(mark)


def rank_of(path: Path) -> int | None:
    """R of a per-rank file named rank{R}.<suffix> (ASCII digits only); None for any other name."""
    digits = path.stem[4:]
    if path.stem.startswith("rank") and digits.isascii() and digits.isdigit() and len(digits) < 10:
        return int(digits)
    return None


def default_run_dir(cfg: JobConfig, suffix: str | None = None) -> Path:
    """<run_root>/<name>-<YYYYmmdd-HHMMSS-mmm>[-suffix]; name defaults to the task name."""
    name = cfg.launch.name or safe_name(cfg.task.name)
    stamp = suffix or time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
    return Path(cfg.launch.run_root).expanduser().resolve() / f"{name}-{stamp}"


def safe_name(name: str) -> str:
    """A folder-name part for a task or run name: a factory's import string ("pkg.mod:make") or label
    ("<pkg.mod.make>", engine.tasks.factory_label) by its function's own name ("make")."""
    name = name.split(":")[-1]
    if name.startswith("<") and name.endswith(">") and " " not in name:
        name = name[1:-1].rsplit(".", 1)[-1]
    keep = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.strip("<>"))
    return keep.strip("-")[:40] or "run"


def tensorboard_rank(logdir: Path, rank: int) -> Path:
    """A rank's folder under a TensorBoard logdir: the run's own mirror, or Run.to_tensorboard's logdir."""
    return logdir / f"rank{rank}"


def run_folders_in(base: Path) -> set[Path]:
    """Run folders (holding run.json) in `base` and one level below (benchmark_scaling nests its runs)."""
    return {p.parent for pattern in ("*/run.json", "*/*/run.json") for p in base.glob(pattern)}


class ScalingBenchDir:
    """The folder of one scaling benchmark (workbench.benchmark_scaling), beside the run folders:

        <run_root>/scaling-<name>-<stamp>/world{N}/   the run at N ranks (a run folder)
        <bench>/scaling.csv                           the measured table
        <bench>/scaling.png                           its plot (workbench bench-scaling)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @classmethod
    def beside(cls, run_dir: Path) -> ScalingBenchDir:
        """The bench folder named after what default_run_dir would name a run."""
        return cls(run_dir.parent / f"scaling-{run_dir.name}")

    def run(self, world_size: int) -> Path:
        return self.root / f"world{world_size}"

    @property
    def table(self) -> Path:
        return self.root / "scaling.csv"

    @property
    def plot(self) -> Path:
        return self.root / "scaling.png"


class SweepDir:
    """The folder of one sweep (workbench.sweep), beside the run folders so that workbench.runs()
    lists its trials (as benchmark_scaling nests its runs):

        <run_root>/sweep-<name>-<stamp>/sweep.json      name, space, metric, direction, trials, executor, driver
        <sweep>/config.yaml                             the base config
        <sweep>/payload.pkl                             the swept task factory or function (cloudpickle)
        <sweep>/study.journal                           Optuna's journal (the study: trials, values, states)
        <sweep>/trial-{N}/                              trial N's run (an ordinary run folder)
        <sweep>/arrays/                                 on SLURM: submitit's folder of the sweep's job arrays
                                                        (sbatch scripts, pickles, each element's task logs)
        <sweep>/elements/{JOB}_{I}.waiting.json         written by element I of array JOB when it starts
        <sweep>/elements/{JOB}_{I}.bound.json           the driver's answer: the trial's run folder, or none
    """

    PREFIX = "sweep-"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @classmethod
    def new(cls, run_root: str | os.PathLike[str], name: str) -> SweepDir:
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
        return cls(Path(run_root).expanduser().resolve() / f"{cls.PREFIX}{name}-{stamp}")

    def create(self) -> SweepDir:
        make_dirs(self.root)
        return self

    @property
    def meta(self) -> Path:
        return self.root / "sweep.json"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def payload_pickle(self) -> Path:
        """payload.pkl: what the run executes, beyond what its config says (workbench.runfolder.layout.PAYLOAD)."""
        return payload_file(self.root)

    @property
    def journal(self) -> Path:
        return self.root / "study.journal"

    def trial(self, number: int) -> Path:
        return self.root / f"trial-{number}"

    @property
    def arrays(self) -> Path:
        """submitit's folder for the sweep's SLURM job arrays (workbench.sweeps.array)."""
        return self.root / "arrays"

    @property
    def elements(self) -> Path:
        return self.root / "elements"

    def element(self, job_id: str, what: str) -> Path:
        """An array element's marker: "waiting" (the element started) or "bound" (the driver's answer)."""
        return self.elements / f"{job_id}.{what}.json"

    def waiting_elements(self) -> list[str]:
        """Job ids ("JOB_I") of the elements that said they started, oldest first."""
        found = self.elements.glob("*.waiting.json") if self.elements.is_dir() else []
        return [p.name[: -len(".waiting.json")] for p in sorted(found, key=lambda p: p.stat().st_mtime_ns)]

    def array_task_file(self, job_id: str, task: int, what: str) -> Path:
        """submitit's file of task `task` of array element `job_id` ("JOB_I"): "log.out", "log.err"
        or "result.pkl"."""
        return self.arrays / f"{job_id}_{task}_{what}"

    def read_meta(self) -> dict[str, Any] | None:
        return read_json(self.meta)

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        meta = {**(self.read_meta() or {}), **fields}
        write_json_atomic(self.meta, meta)
        return meta


def sweeps_under(run_root: str | os.PathLike[str]) -> list[SweepDir]:
    """Every sweep folder under run_root, oldest first."""
    base = Path(run_root).expanduser().resolve()
    found = [p.parent for p in base.glob(f"{SweepDir.PREFIX}*/sweep.json")] if base.is_dir() else []
    return [SweepDir(p) for p in sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a private temp name in the same folder and rename it: readers never see half a
    file; the file is 0600 whatever the umask."""
    write_atomic(path, json.dumps(data, default=str).encode())


def read_json(path: Path, default: Any = None, schema: records.Schema = records.ANY_OBJECT) -> Any:
    """The JSON object in `path`, cleaned by `schema`; `default` when the file is absent or does not
    hold one (a warning names it).  Never raises for what the file holds."""
    found = records.read_object(path, schema)
    return default if found is None else found


class PoolDir(RunDir):
    """The folder of a warm pool (workbench.Pool): the channel between the submitting side and the
    pool's ranks.  Shaped like a run folder where that helps (logs/, procs/, rendezvous/ and the
    controller's facts, so the executors and the process helpers serve both):

        <run_root>/pools/<name>/pool.json              name, world size, backend, executor, job id, closed
        <pool>/jobs/{N}.json                           job N: a run folder to run, or code to exec (%%ranks)
        <pool>/jobs/{N}.cancel                         job N is cancelled (Run.cancel on a pool job)
        <pool>/done/{N}-rank{R}.json                   rank R is done with job N: outcome, memory, exec output
        <pool>/taken/rank{R}.json                      the job rank R's warm worker is running now
        <pool>/ready/rank{R}.json                      rank R's warm worker is up: generation, baseline memory
        <pool>/procs/rank{R}.json, logs/, rendezvous/  as in a run folder
    """

    @property
    def meta(self) -> Path:
        return self.root / "pool.json"

    def create(self) -> PoolDir:
        make_dirs(self.root)
        for sub in ("", "jobs", "done", "taken", "ready", "procs", "logs", "rendezvous", "status", "errors"):
            make_dirs(self.root / sub)
            os.chmod(self.root / sub, DIR_MODE)
        return self

    def job(self, number: int) -> Path:
        return self.root / "jobs" / f"{number}.json"

    def job_cancel(self, number: int) -> Path:
        return self.root / "jobs" / f"{number}.cancel"

    def job_numbers(self) -> list[int]:
        folder = self.root / "jobs"
        found = [p.stem for p in folder.glob("*.json")] if folder.is_dir() else []
        return sorted(int(n) for n in found if n.isascii() and n.isdigit())

    def done(self, number: int, rank: int) -> Path:
        return self.root / "done" / f"{number}-rank{rank}.json"

    def done_numbers(self) -> list[int]:
        """Job numbers some rank is done with."""
        folder = self.root / "done"
        found = {p.stem.split("-")[0] for p in folder.glob("*-rank*.json")} if folder.is_dir() else set()
        return sorted(int(n) for n in found if n.isascii() and n.isdigit())

    def taken(self, rank: int) -> Path:
        return self.root / "taken" / f"rank{rank}.json"

    def ready(self, rank: int) -> Path:
        return self.root / "ready" / f"rank{rank}.json"

    @staticmethod
    def generation_key(generation: int) -> str:
        """The meeting of the pool's ranks that start their generation-th warm workers."""
        return f"gen{generation}"


def pool_dir(run_root: str | os.PathLike[str], name: str) -> PoolDir:
    """<run_root>/pools/<name>/"""
    return PoolDir(Path(run_root).expanduser().resolve() / "pools" / name)


def pools_under(run_root: str | os.PathLike[str]) -> list[PoolDir]:
    """Every pool folder under run_root/pools (live or not)."""
    folder = Path(run_root).expanduser().resolve() / "pools"
    return [PoolDir(p) for p in sorted(folder.iterdir()) if (p / "pool.json").exists()] if folder.is_dir() else []


SHARDED_TRAINER_STATE = "trainer.pt"
"""In a sharded checkpoint's folder: everything but the model and optimizer shards, from rank 0."""
_STEP = re.compile(r"step-(\d+)(\.pt)?")


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint (step-N.pt or step-N/) was written at."""
    found = _STEP.fullmatch(path.name)
    if found is None:
        raise ValueError(f"{path} is not a checkpoint (step-N.pt or step-N/)")
    return int(found.group(1))
