"""An engine run's ranks are forked from a local controller that imported torch once
(workbench.engine.forked) and train exactly as fresh processes do; a script's rank is a fresh
process, as under torchrun; WORKBENCH_FORK=0 starts every rank fresh; a controller stopped while it
imports torch starts no rank, and the run reads cancelled."""

from __future__ import annotations

import os
import signal
import time

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import run_processes
from tests.support.runs import local_cfg
from workbench.proctree import Proc
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


def _catches(pid: int, sig: int) -> bool:
    """The process has a handler for `sig` (/proc/PID/status SigCgt)."""
    with open(f"/proc/{pid}/status") as fh:
        caught = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


def test_a_controller_stopped_while_it_imports_torch_starts_no_rank_and_the_run_reads_cancelled(tmp_path):
    run = workbench.submit(local_cfg(tmp_path, max_steps=12, checkpoint_every_steps=None))
    controller = Proc.from_dict((read_json(RunDir(run.folder).meta) or {}).get("controller"))
    assert controller is not None
    deadline = time.monotonic() + 30
    while not _catches(controller.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.01)  # its stop handler is in place: it is importing torch now (seconds)
    os.kill(controller.pid, signal.SIGTERM)  # as `kill PID` from a terminal
    assert run.wait(timeout=120).state == "cancelled"
    assert not any(RunDir(run.folder).procs(rank).exists() for rank in (0, 1))  # no agent started
    assert not run_processes(run.folder)


def test_a_controller_that_cannot_preload_torch_says_so_and_the_ranks_report_the_import_error(tmp_path, monkeypatch):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "sympy.py").write_text("raise ImportError('a sympy.py of the user shadows the package')\n")
    monkeypatch.setenv("PYTHONPATH", f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run = workbench.submit(local_cfg(tmp_path, max_steps=4, checkpoint_every_steps=None))
    assert run.wait(timeout=180).state == "failed"
    log = RunDir(run.folder).controller_log.read_text()
    assert "not preloading torch (ImportError: a sympy.py of the user shadows the package)" in log, log
    assert "shadows the package" in str(run.exception())
    assert not run_processes(run.folder)
