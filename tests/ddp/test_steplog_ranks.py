"""The step logger's cadence across real ranks: however differently their steps take, every rank
reduces at the same steps (a reduce is a collective) and sees a stop at the same step."""

from __future__ import annotations

import json
import tempfile
import time

import pytest
import torch

from tests.support.ddp import run_ranks
from workbench.engine.monitor import RankMonitor
from workbench.engine.steplog import StepLogger
from workbench.runfolder.layout import RunDir

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(120)]
STEPS = 60


def _log_steps(rank: int, run_dir: str) -> dict:
    monitor = RankMonitor(RunDir(run_dir), rank, 2)
    logger = StepLogger(monitor, world_size=2, device="cpu", max_every=10, every_s=0.05)
    reduced_at, stopped_at = [], None
    for step in range(1, STEPS + 1):
        # rank 1 is slower, and both slow down half-way: the cadence changes as the run goes
        time.sleep((0.01 if step > STEPS // 2 else 0.0005) * (1 + rank))
        logger.poll()
        due = logger.due(step)
        stop = logger.end_step(step, {"rank": rank, "step": step, "loss": None},
                               torch.tensor(float(step * (rank + 1))), stop=rank == 1 and step == 7)
        if due:
            reduced_at.append(step)
        if stop and stopped_at is None:
            stopped_at = step
    logger.finish()
    monitor.close()
    lines = RunDir(run_dir).metrics(rank).read_text().splitlines()
    return {"reduced_at": reduced_at, "stopped_at": stopped_at, "records": [json.loads(x) for x in lines]}


def test_ranks_reduce_at_the_same_steps_and_stop_together():
    run_dir = tempfile.mkdtemp()
    out = run_ranks(_log_steps, run_dir=run_dir)
    assert out[0]["reduced_at"] == out[1]["reduced_at"]
    gaps = {b - a for a, b in zip(out[0]["reduced_at"], out[0]["reduced_at"][1:])}
    assert len(gaps) > 1 and max(gaps) <= 10, gaps  # the cadence adapted, within the cap
    assert out[0]["stopped_at"] == out[1]["stopped_at"] is not None
    for rank in (0, 1):
        records = out[rank]["records"]
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        assert all(r["loss"] == r["step"] * (rank + 1) for r in records)
        assert all(r["loss_reduced"] == pytest.approx(1.5 * r["step"]) for r in records)
