"""Lightning (Trainer and Fabric), Accelerate and Hugging Face Trainer jobs get per-rank streams by
adding one line; real packages, real 2-rank DDP on CPU.  Each framework runs once: two as scripts under
`workbench launch`, two as a user's function through `submit_fn`, so both ways in meet a real framework
(the launchers themselves are tested apart, in test_script_mode.py and test_submit_fn.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from tests.support import SCRIPTS
from workbench.integrations import numbers

INTEGRATIONS = SCRIPTS / "integrations"
pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]


def _launch(tmp_path: Path, script: str) -> workbench.Run:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", str(INTEGRATIONS / script), "--nproc", "2",
                           "--quiet", "--set", f"launch.run_root={tmp_path / 'runs'}", "--", str(out)],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (folder,) = (tmp_path / "runs").iterdir()
    return workbench.Run.load(folder)


def _per_rank(run: workbench.Run, column: str, distinct: bool = True, last_step: int = 12) -> None:
    frame = run.metrics()
    assert sorted(frame["rank"].unique()) == [0, 1]
    assert (frame.groupby("rank")["step"].max() == last_step).all()
    by_step = frame.set_index(["step", "rank"])[column].unstack()  # every logged step: none dropped
    assert by_step.notna().all().all(), by_step[by_step.isna().any(axis=1)]
    if distinct:  # each rank's own value, not rank 0's copied
        assert (by_step[0] != by_step[1]).any()


def test_lightning_trainer_through_submit_fn(tmp_path):
    _per_rank(_submit_fn(tmp_path, "lightning_trainer.py"), "train_loss", last_step=11)  # the Trainer counts from 0


def test_lightning_fabric_under_launch(tmp_path):
    _per_rank(_launch(tmp_path, "fabric_loop.py"), "loss")


def test_accelerate_tracker_through_submit_fn(tmp_path):
    run = _submit_fn(tmp_path, "accelerate_loop.py")
    _per_rank(run, "loss")
    _per_rank(run, "lr", distinct=False)  # logged by a second accelerator.log at the same step: both kept
    assert "note" not in run.metrics()


def test_transformers_trainer_callback_under_launch(tmp_path):
    run = _launch(tmp_path, "hf_trainer.py")
    _per_rank(run, "loss", distinct=False)  # the Trainer logs the loss averaged over ranks
    _hf_summary_beside_the_last_loss(run)


def _hf_summary_beside_the_last_loss(run: workbench.Run) -> None:
    """At its last step the Trainer logs the step's loss, then its summary: both are kept."""
    last = run.metrics().groupby("rank").last()  # each column's last value
    for column in ("loss", "learning_rate", "grad_norm", "train_loss", "train_runtime"):
        assert last[column].notna().all(), column
    frame = run.metrics()
    at_last = frame[frame["step"] == 12]
    assert at_last["loss"].notna().all() and at_last["train_loss"].notna().all()


def test_only_plain_numbers_are_forwarded():
    import torch

    found = numbers({"loss": torch.tensor(0.5), "lr": 1e-3, "epoch": 2, "name": "x", "flag": True,
                     "vec": torch.ones(3), "bad": float("nan")})
    assert found == {"loss": 0.5, "lr": 1e-3, "epoch": 2.0}


def _run_script_in_fn(script: str, out: str) -> None:
    """A user's function whose body is the framework's training code (here: the same script)."""
    import runpy
    import sys

    sys.argv = [script, out]
    runpy.run_path(script, run_name="__main__")


def _submit_fn(tmp_path: Path, script: str) -> workbench.Run:
    cfg = workbench.JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run = workbench.submit_fn(_run_script_in_fn, str(INTEGRATIONS / script), str(tmp_path / "out"), cfg=cfg)
    assert run.wait(timeout=250).state == "finished", run.exception()
    return run
