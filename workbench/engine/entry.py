"""The callable submitit runs, one per rank: say "starting", then be the rank's agent
(workbench.engine.agent), which applies the torchrun contract and runs the rank in a worker process.

It is pickled into the run folder and holds only plain data: what the worker runs (the engine, a
script, a function) is in the run folder (config.yaml, and payload.pkl for a task factory, a
ScriptPayload or an FnPayload), unpickled by the worker, where a failure is reported like any other.  As a
submitit Checkpointable, a preempted or timed-out job is requeued and the next attempt resumes from
the run's latest checkpoint."""

from __future__ import annotations

import os
from typing import Any

import submitit

from workbench.engine.monitor import announce_starting
from workbench.engine.rendezvous import RankContract, attempt
from workbench.runfolder.layout import RunDir
from workbench.runfolder.private import UMASK


def _announce(run_dir: str) -> None:
    """Write this rank's "starting" status before anything slow (torch, the rendezvous)."""
    announce_starting(RunDir(run_dir), submitit.JobEnvironment().global_rank, attempt())


class RankEntry(submitit.helpers.Checkpointable):
    """One rank: its agent, and through it the worker that trains or runs the user's code."""

    def __init__(self, run_dir: str, contract: RankContract, max_restarts: int = 0):
        self.run_dir, self.contract, self.max_restarts = run_dir, contract, max_restarts

    def __call__(self) -> dict[str, Any]:
        _announce(self.run_dir)
        os.umask(UMASK)  # what this rank, its worker and submitit write here is private
        from workbench.engine.agent import run_agent

        return run_agent(self.run_dir, self.contract, [], self.max_restarts)
