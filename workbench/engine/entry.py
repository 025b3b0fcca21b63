"""The callable submitit runs in every task: it sets the torchrun contract, then trains the rank.

It is pickled (cloudpickle) into the run folder, so a task factory defined in a notebook cell
travels with it by value.  As a submitit Checkpointable, a preempted or timed-out SLURM job is
requeued and the new attempt resumes from the run's latest checkpoint."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import submitit

from workbench.engine.env import DistEnv
from workbench.launch.rendezvous import publish_port, wait_for_port
from workbench.rundir import RunDir


@dataclass
class TaskEnv:
    """How a submitit task becomes a torchrun-style rank."""

    local: bool
    """Rendezvous on 127.0.0.1 with `port` (local) or on the first node of the allocation (SLURM)."""
    port: int = 0
    gpu_ids: list[str] = field(default_factory=list)
    """Device ids the user made visible; rank with local rank i gets gpu_ids[i]."""
    rendezvous_timeout_s: float = 300.0

    def export(self, run: RunDir) -> DistEnv:
        job = submitit.JobEnvironment()
        world, nodes = job.num_tasks, job.num_nodes
        host = "127.0.0.1" if self.local else job.hostnames[0]
        port = self.port or self._slurm_port(run, job)
        env = DistEnv(job.global_rank, job.local_rank, world, world // nodes, host, port)
        env.export()
        if self.gpu_ids:  # one GPU per rank, chosen from the user's own visible set
            os.environ["CUDA_VISIBLE_DEVICES"] = self.gpu_ids[job.local_rank % len(self.gpu_ids)]
        return env

    def _slurm_port(self, run: RunDir, job: Any) -> int:
        path = run.rendezvous(f"{job.job_id}-{attempt()}")
        if job.global_rank == 0:
            return publish_port(path, job.hostnames[0])
        return wait_for_port(path, self.rendezvous_timeout_s)


def attempt() -> int:
    """How many times this job was requeued before (SLURM_RESTART_COUNT; 0 locally)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


class RankEntry(submitit.helpers.Checkpointable):
    """Train one rank of the engine."""

    def __init__(self, cfg_data: dict[str, Any], run_dir: str, task_env: TaskEnv,
                 factory: Callable[..., Any] | None = None):
        self.cfg_data, self.run_dir, self.task_env, self.factory = cfg_data, run_dir, task_env, factory

    def __call__(self) -> dict[str, Any]:
        from workbench.config import JobConfig
        from workbench.engine.rank import run_rank

        self.task_env.export(RunDir(self.run_dir))
        return run_rank(JobConfig.from_dict(self.cfg_data), self.run_dir, self.factory, attempt())


class ScriptEntry(submitit.helpers.Checkpointable):
    """Run an existing torchrun-style script as one rank (runpy, same process, same environment)."""

    def __init__(self, script: str, args: list[str], run_dir: str, task_env: TaskEnv):
        self.script, self.args, self.run_dir, self.task_env = script, list(args), run_dir, task_env

    def __call__(self) -> int:
        from workbench.launch.script import run_script_rank

        env = self.task_env.export(RunDir(self.run_dir))
        return run_script_rank(self.script, self.args, self.run_dir, env.rank, attempt())
