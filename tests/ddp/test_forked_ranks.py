"""An engine run's ranks are forked from a local controller that imported torch once
(workbench.engine.forked) and train exactly as fresh processes do; a script's rank is a fresh
process, as under torchrun; WORKBENCH_FORK=0 starts every rank fresh."""

from __future__ import annotations


import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import run_processes
from tests.support.runs import local_cfg
from workbench.runfolder.layout import RunDir, read_json

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]

SCRIPT = SCRIPTS / "train_ddp.py"


def _forked(run: workbench.Run) -> list[bool]:
    folder = RunDir(run.folder)
    return [bool((read_json(folder.procs(rank)) or {}).get("forked")) for rank in (0, 1)]


def test_forked_ranks_train_the_same_losses_as_fresh_ones(tmp_path, monkeypatch):
    cfg = local_cfg(tmp_path, max_steps=12, checkpoint_every_steps=None)
    warm = workbench.submit(cfg)
    assert warm.wait(timeout=180).state == "finished", warm.exception()
    monkeypatch.setenv("WORKBENCH_FORK", "0")
    fresh = workbench.submit(cfg)
    assert fresh.wait(timeout=180).state == "finished", fresh.exception()
    assert _forked(warm) == [True, True] and _forked(fresh) == [False, False]
    losses = [run.metrics().sort_values(["step", "rank"])["loss"].tolist() for run in (warm, fresh)]
    assert losses[0] == losses[1] and len(losses[0]) == 24  # bit for bit: same seeds, same data, same steps
    assert not run_processes(warm.folder) and not run_processes(fresh.folder)


def test_a_scripts_ranks_are_fresh_processes(tmp_path):
    run = workbench.submit_script(SCRIPT, ["--steps", "3"], local_cfg(tmp_path), nproc=2)
    assert run.wait(timeout=180).state == "finished", run.exception()
    assert _forked(run) == [False, False]
