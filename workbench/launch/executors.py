"""submitit executors built from the launch section: one rank process per submitit task, a real time limit."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import submitit
import submitit.local.local
import submitit.slurm.slurm
from submitit.core.utils import FailedJobError, FailedSubmissionError

from workbench.config.devices import parse_visible_devices, visible_gpu_count
from workbench.config.sections import JobConfig
from workbench.config.tasknames import runs_own_code
from workbench.config.validate import parse_time_limit
from workbench.engine.rendezvous import RUN_DIR_ENV, RankContract, free_port
from workbench.errors import SubmitError
from workbench.launch import starter
from workbench.proctree import parent_death_signal
from workbench.runfolder.layout import PoolDir, RunDir
from workbench.runfolder.private import open_private
from workbench.testhook import kill_point


def make_executor(cfg: JobConfig, run: RunDir, stop_with_caller: bool = False,
                  ) -> tuple[submitit.Executor, RankContract]:
    if cfg.launch.executor == "slurm":
        return slurm_executor(cfg, run), RankContract(local=False)
    return local_executor(cfg, run, stop_with_caller)


class LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, whose controller (workbench.launch.local_controller) runs in a
    session of its own: the run outlives the process that submitted it, unless `stop_with_caller`
    (the CLI), where the kernel stops the controller (SIGTERM) when the caller ends, however it ends."""

    def __init__(self, folder: Path, run: RunDir, stop_with_caller: bool = False, engine: bool = True):
        super().__init__(folder=folder)
        self.run, self.stop_with_caller = run, stop_with_caller
        self.engine = engine  # the run trains with the engine, not the user's own code (starter.controller)

    def _submit_command(self, command: str) -> submitit.local.local.LocalJob[Any]:
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = {**os.environ, "SUBMITIT_LOCAL_NTASKS": str(ntasks), "SUBMITIT_LOCAL_COMMAND": command,
               "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
               "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
               "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_STDERR_TO_STDOUT": "",
               "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_WITH_SHELL": "", RUN_DIR_ENV: str(self.run.root)}
        preexec = parent_death_signal(signal.SIGTERM) if self.stop_with_caller else None
        controller = [sys.executable, "-m", "workbench.launch.local_controller", str(self.folder)]
        with open_private(self.run.controller_log, "ab") as log, open(os.devnull, "rb") as devnull:
            # not the caller's terminal or pipes; forked warm from this process's starter where it can be
            process: Any = starter.controller(controller, env, devnull.fileno(), log.fileno(), self.stop_with_caller,
                                              self.engine)
            if process is None:
                process = subprocess.Popen(controller, env=env, start_new_session=True, preexec_fn=preexec,
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        kill_point("submit.controller")  # a test hook: the controller runs, waiting for its pickle's name
        return submitit.local.local.LocalJob(folder=self.folder, job_id=str(process.pid), process=process,
                                             tasks=list(range(ntasks)))


PENDING_PICKLE = re.compile(r"[0-9a-f]{32}\.pkl")
"""The name submitit gives a job's pickle before the job exists (a uuid4's hex), renamed to
JOB_submitted.pkl once the job has an id."""


def finish_submission(run: RunDir, job_id: str) -> bool:
    """Give a local job's pickle the name its controller waits for (JOB_submitted.pkl), where its
    submitter was killed between starting the controller and submitit's rename (the controller's
    rank would wait 60 s for it, then fail).  True when the pickle is there now."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(run.logs, job_id)
    if paths.submitted_pickle.exists():
        return True
    pending = [p for p in run.logs.glob("*.pkl") if PENDING_PICKLE.fullmatch(p.name)]
    if len(pending) != 1:
        return False
    paths.move_temporary_file(pending[0], "submitted_pickle")
    return True


def local_executor(cfg: JobConfig, run: RunDir, stop_with_caller: bool = False,
                   ) -> tuple[submitit.LocalExecutor, RankContract]:
    engine = not runs_own_code(cfg.task.name) and not isinstance(run, PoolDir)  # a pool runs user code too
    executor = LocalExecutor(run.logs, run, stop_with_caller, engine)
    # Not submitit's 2-minute default: the job's own limit.  USR2 comes 30 s before it.
    executor.update_parameters(tasks_per_node=cfg.dist.procs_per_node, nodes=1,
                               timeout_min=parse_time_limit(cfg.launch.time_limit), signal_delay_s=30)
    gpus = visible_gpu_count()
    gpu_ids = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)[:gpus] if gpus else []
    return executor, RankContract(local=True, port=free_port("127.0.0.1"), gpu_ids=gpu_ids)


def slurm_executor(cfg: JobConfig, run: RunDir) -> submitit.SlurmExecutor:
    executor = SlurmExecutor(folder=run.logs, max_num_timeout=20)
    executor.update_parameters(**slurm_parameters(cfg, run))
    return executor


def slurm_parameters(cfg: JobConfig, run: RunDir | None = None) -> dict[str, Any]:
    s = cfg.launch.slurm
    minutes = parse_time_limit(cfg.launch.time_limit)
    params: dict[str, Any] = {
        "job_name": f"wb-{cfg.launch.name or cfg.task.name.split(':')[-1].strip('<>')}"[:40],
        "nodes": cfg.dist.nodes, "ntasks_per_node": cfg.dist.procs_per_node,
        "cpus_per_task": s.cpus_per_task, "time": minutes,
        "signal_delay_s": 90 if minutes > 5 else 30,  # SIGUSR2 this long before the limit
        "setup": list(s.setup), "additional_parameters": dict(s.sbatch_options),
    }
    optional = {"partition": s.partition, "account": s.account, "qos": s.qos, "mem": s.mem,
                "constraint": s.constraint, "gpus_per_node": s.gpus_per_node or None}
    params.update({k: v for k, v in optional.items() if v is not None})
    if run is not None:
        params["comment"] = f"workbench run {run.root}"
    return params


# --- SLURM's own words: a failing sbatch or scancel is one line carrying SLURM's message -----------


class SlurmWatcher(submitit.slurm.slurm.SlurmInfoWatcher):
    """submitit's sacct poller, except that a failing sacct (its controller or accounting database
    does not answer) is kept as one line in SLURM's words (`failure`) instead of submitit's
    "Bypassing sacct error" warning on every poll; a job whose state is then unknown raises it."""

    failure: str | None = None

    def update(self) -> None:
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        try:
            done = subprocess.run(command, capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.failure = f"sacct did not run: {exc}; run from a cluster login node or use launch.executor: local"
        else:
            if done.returncode:
                said = (done.stderr or done.stdout).decode(errors="replace")
                self.failure = slurm_failure("sacct", said, done.returncode)
            else:
                self.failure, self._output = None, done.stdout
                self._info_dict.update(self.read_info(self._output))
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)


class SlurmJob(submitit.SlurmJob):
    """submitit's SlurmJob, whose cancel says what scancel said (one SubmitError line) instead of a
    CalledProcessError after scancel's own stderr, and whose state, when sacct fails, is that
    failure in SLURM's words (one SubmitError line) instead of submitit's warnings and UNKNOWN."""

    watcher = SlurmWatcher(delay_s=600)

    def done(self, force_check: bool = False) -> bool:
        if super().done(force_check):
            return True
        if self.watcher.failure is not None:
            raise SubmitError(self.watcher.failure)
        return False

    def cancel(self, check: bool = True) -> None:
        try:
            done = subprocess.run(["scancel", str(self.job_id)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SubmitError(f"scancel {self.job_id} did not run: {exc}; cancel the job with scancel on a "
                              "login node") from None
        if check and done.returncode:
            raise SubmitError(slurm_failure(f"scancel {self.job_id}", done.stderr or done.stdout, done.returncode))


class SlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor: a refused sbatch (controller unreachable, invalid partition or account,
    resources the cluster does not have) is one SubmitError line carrying SLURM's own message."""

    job_class = SlurmJob

    def _submit_command(self, command: str) -> Any:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr itself on failure
            try:
                return super()._submit_command(command)
            except FailedJobError as exc:
                cause = exc.__cause__
                code = cause.returncode if isinstance(cause, subprocess.CalledProcessError) else None
                raise SubmitError(slurm_failure("sbatch", str(exc), code)) from None
            except FailedSubmissionError as exc:
                raise SubmitError(slurm_failure("sbatch", str(exc), None)) from None
            except OSError as exc:
                raise SubmitError(f"sbatch did not run: {exc}; run from a cluster login node or use "
                                  "launch.executor: local") from None


def slurm_failure(command: str, message: str, returncode: int | None) -> str:
    """One line: which SLURM command failed, SLURM's own message (its lines joined), and what to do."""
    said = "; ".join(line.strip() for line in message.strip().splitlines() if line.strip()) or "no message"
    status = f" (exit {returncode})" if returncode is not None else ""
    low = said.lower()
    if command == "sacct" and ("database" in low or "connection refused" in low or "storage" in low):
        fix = ("SLURM's accounting (slurmdbd) does not answer, so the job's state is unknown: check that "
               "`sacct` works here, or ask your cluster's admins; the run folder still has what the ranks wrote")
    elif "contact slurm controller" in low or "connection refused" in low or "connect failure" in low:
        fix = "the SLURM controller does not answer: check that `sinfo` works here, or ask your cluster's admins"
    elif command.startswith("scancel"):
        fix = "the job may have ended already (`squeue -j ID`, `sacct -j ID`)"
    else:
        fix = ("the job was not submitted; check launch.slurm (partition, account, qos, sbatch_options), "
               "dist.nodes and launch.time_limit against what the cluster offers (`sinfo`)")
    return f"{command} failed{status}: {said}; {fix}"


# --- a sweep's trials as one job array (workbench.sweeps.array) ---------------------------------


class ArraySlurmExecutor(SlurmExecutor):
    """A SlurmExecutor whose batch (`submit_array`) is always one job array, `array_parallelism` of
    its elements at once (sbatch --array=0-N%P): submitit sends a batch of one as a plain job, and
    sends its arrays through a plain submitit SlurmExecutor (not this module's, which puts a refused
    sbatch in SLURM's words) and follows them as submitit's SlurmJob (not this module's)."""

    def _internal_process_submissions(self, delayed: list[Any]) -> list[Any]:
        import tempfile

        from submitit.core.utils import JobPaths

        folder = JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickles = []
        for submission in delayed:
            handle, name = tempfile.mkstemp(suffix=".pkl", dir=folder)  # renamed to JOB_I_submitted.pkl below
            os.close(handle)
            path = Path(name)
            submission.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            submission.dump(path)
            pickles.append(path)
        array = ArraySlurmExecutor(self.folder, self.max_num_timeout)
        array.update_parameters(**self.parameters)
        array.parameters["map_count"] = len(delayed)
        first = array._submit_command(self._submitit_command_str)
        jobs = [SlurmJob(folder=self.folder, job_id=f"{first.job_id}_{i}", tasks=list(range(first.num_tasks)))
                for i in range(len(delayed))]
        for job, path in zip(jobs, pickles):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs


def slurm_array_executor(cfg: JobConfig, folder: Path, parallel: int, after: list[str], name: str,
                         ) -> ArraySlurmExecutor:
    """An executor for one job array of `cfg`'s resources, `parallel` elements at once, starting
    once the jobs `after` ended (sbatch --dependency=afterany:...)."""
    executor = ArraySlurmExecutor(folder=folder, max_num_timeout=20)
    params = slurm_parameters(cfg)
    params.update(array_parallelism=parallel, comment=f"workbench sweep {folder.parent}", job_name=f"wb-{name}"[:40])
    if after:
        extra = params["additional_parameters"]
        params["additional_parameters"] = {**extra, "dependency": f"afterany:{':'.join(after)}"}
    executor.update_parameters(**params)
    return executor


def slurm_shape(cfg: JobConfig) -> dict[str, Any]:
    """What sbatch asks of the cluster for cfg (nodes, tasks, CPUs, GPUs, time, partition, ...):
    trials whose shapes differ cannot be elements of one job array."""
    params = slurm_parameters(cfg)
    for key in ("job_name", "comment"):
        params.pop(key, None)
    return params
