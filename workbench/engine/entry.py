"""The callables submitit runs, one per rank: apply the torchrun contract, then be the rank's agent
(workbench.engine.agent), which runs the engine or the user's script in a worker process.

They are pickled into the run folder and hold only plain data (a task factory passed as a Python
object travels in the run's task.pkl, unpickled by the worker, where a failure is reported like any
other).  As submitit Checkpointables, a preempted or timed-out job is requeued and the next attempt
resumes from the run's latest checkpoint."""

from __future__ import annotations

from typing import Any

import submitit

from workbench.engine.rendezvous import RankContract


class RankEntry(submitit.helpers.Checkpointable):
    """Train one rank of the engine."""

    def __init__(self, run_dir: str, contract: RankContract, max_restarts: int = 0):
        self.run_dir, self.contract, self.max_restarts = run_dir, contract, max_restarts

    def __call__(self) -> dict[str, Any]:
        from workbench.engine.agent import run_agent

        return run_agent(self.run_dir, self.contract, [], self.max_restarts)


class ScriptEntry(submitit.helpers.Checkpointable):
    """Run an existing torchrun-style script as one rank (runpy in the worker, same environment)."""

    def __init__(self, script: str, args: list[str], run_dir: str, contract: RankContract, max_restarts: int = 0):
        self.script, self.args, self.run_dir, self.contract = script, list(args), run_dir, contract
        self.max_restarts = max_restarts

    def __call__(self) -> dict[str, Any]:
        from workbench.engine.agent import run_agent

        return run_agent(self.run_dir, self.contract, ["--script", self.script, "--", *self.args], self.max_restarts)
