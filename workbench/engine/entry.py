"""The callables submitit runs in every rank process: apply the torchrun contract, then train the
rank (engine) or run the user's script.

They are pickled (cloudpickle) into the run folder, so a task factory defined in a notebook cell
travels with them by value.  As submitit Checkpointables, a preempted or timed-out SLURM job is
requeued and the new attempt resumes from the run's latest checkpoint."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import submitit

from workbench.engine.monitor import announce_starting
from workbench.engine.rendezvous import RankContract, attempt
from workbench.engine.script import FnJob, ScriptJob
from workbench.private import UMASK
from workbench.rundir import RunDir


def _announce(run_dir: str) -> None:
    """Write this rank's "starting" status before anything slow (torch, the rendezvous)."""
    announce_starting(RunDir(run_dir), submitit.JobEnvironment().global_rank, attempt())


class RankEntry(submitit.helpers.Checkpointable):
    """Train one rank of the engine."""

    def __init__(self, cfg_data: dict[str, Any], run_dir: str, contract: RankContract,
                 factory: Callable[..., Any] | None = None):
        self.cfg_data, self.run_dir, self.contract, self.factory = cfg_data, run_dir, contract, factory

    def __call__(self) -> dict[str, Any]:
        _announce(self.run_dir)
        from workbench.config import JobConfig
        from workbench.engine.rank import run_rank

        os.umask(UMASK)  # what this rank and submitit write here (its result pickle) is private
        self.contract.export(RunDir(self.run_dir))
        return run_rank(JobConfig.from_dict(self.cfg_data), self.run_dir, self.factory, attempt())


class ScriptEntry(submitit.helpers.Checkpointable):
    """Run an existing torchrun-style script or module as one rank (runpy, same process)."""

    def __init__(self, job: ScriptJob, run_dir: str, contract: RankContract):
        self.job, self.run_dir, self.contract = job, run_dir, contract

    def __call__(self) -> int:
        _announce(self.run_dir)
        from workbench.engine.script import run_script_rank

        os.umask(UMASK)  # what this rank and submitit write here (its result pickle) is private
        env = self.contract.export(RunDir(self.run_dir))
        return run_script_rank(self.job, self.run_dir, env.rank, attempt())


class FnEntry(submitit.helpers.Checkpointable):
    """Call a function on one rank, inside the default process group (workbench.submit_fn)."""

    def __init__(self, job: FnJob, run_dir: str, contract: RankContract):
        self.job, self.run_dir, self.contract = job, run_dir, contract

    def __call__(self) -> Any:
        from workbench.engine.script import run_fn_rank

        os.umask(UMASK)  # what this rank and submitit write here (its result pickle) is private
        env = self.contract.export(RunDir(self.run_dir))
        return run_fn_rank(self.job, self.run_dir, env.rank, attempt())
