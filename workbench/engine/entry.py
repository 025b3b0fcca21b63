"""The callables submitit runs in every rank process: apply the torchrun contract, then train the
rank (engine) or run the user's script.

They are pickled (cloudpickle) into the run folder, so a task factory defined in a notebook cell
travels with them by value.  As submitit Checkpointables, a preempted or timed-out SLURM job is
requeued and the new attempt resumes from the run's latest checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import submitit

from workbench.engine.monitor import announce_starting
from workbench.engine.rendezvous import RankContract, attempt
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

        self.contract.export(RunDir(self.run_dir))
        return run_rank(JobConfig.from_dict(self.cfg_data), self.run_dir, self.factory, attempt())


class ScriptEntry(submitit.helpers.Checkpointable):
    """Run an existing torchrun-style script as one rank (runpy, same process, same environment)."""

    def __init__(self, script: str, args: list[str], run_dir: str, contract: RankContract):
        self.script, self.args, self.run_dir, self.contract = script, list(args), run_dir, contract

    def __call__(self) -> int:
        _announce(self.run_dir)
        from workbench.engine.script import run_script_rank

        env = self.contract.export(RunDir(self.run_dir))
        return run_script_rank(self.script, self.args, self.run_dir, env.rank, attempt())
