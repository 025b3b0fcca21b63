"""A sweep whose driver is killed, for real (issue 30 item 6): the driver, a real process, SIGKILLs
itself at each step of starting a trial (WORKBENCH_KILL_AT, the test hook in workbench/testhook.py:
after Optuna's ask, after the values, after the run folder, after its controller started (before
and after submitit named the job's pickle) and after the submission), and the sweep
resumed (Sweep.load, or `workbench sweep --resume` as a user types it) runs every grid point once,
with no process of any trial left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from tests.support import REPO
from tests.support.lifecycle import CLI, assert_nothing_left, cfg
from workbench.launch.run import Run
from workbench.runfolder.layout import SweepDir
from workbench.testhook import KILL_AT_ENV

optuna = pytest.importorskip("optuna")
pytestmark = [pytest.mark.ddp, pytest.mark.timeout(400)]

LRS = [1e-3, 2e-3]
DRIVER = f"""
import sys, workbench
from workbench.config import JobConfig
cfg = JobConfig.from_yaml(sys.argv[1])
sweep = workbench.sweep(cfg, {{"train.lr": {LRS!r}}}, name="killed", background=False)
print(sweep.folder, flush=True)
sweep.wait()
"""
WINDOWS = ["sweep.asked", "sweep.values", "submit.prepared", "submit.controller", "submit.started", "sweep.submitted"]


def _killed_at(tmp_path: Path, point: str) -> SweepDir:
    """Run the driver until it kills itself at `point`, in trial 0's start; the sweep's folder."""
    config = tmp_path / "base.yaml"
    cfg(tmp_path, max_steps=6, eval_every_steps=3, checkpoint_every_steps=None, dist={"procs_per_node": 1}
        ).to_yaml(config)
    driver = subprocess.run([sys.executable, "-c", DRIVER, str(config)], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, KILL_AT_ENV: point}, timeout=240)
    assert driver.returncode == -signal.SIGKILL, driver.stdout + driver.stderr
    return SweepDir(Path(driver.stdout.strip().splitlines()[0]))


@pytest.mark.parametrize("point", WINDOWS)
def test_a_driver_killed_in_each_window_of_starting_a_trial_resumes_and_runs_every_point_once(tmp_path, point):
    folder = _killed_at(tmp_path, point)
    if point == "sweep.asked":  # the window that printed a traceback and lost its grid point: from a terminal
        done = subprocess.run([*CLI, "sweep", "--resume", str(folder.root)], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0 and "this is a bug" not in done.stderr, done.stdout + done.stderr
        sweep = workbench.sweeps.Sweep.load(folder.root, resume=False)
    else:
        sweep = workbench.sweeps.Sweep.load(folder.root).wait(timeout=300)
    frame = sweep.frame()
    finished = frame[frame["state"] == "finished"]
    assert sorted(finished["train.lr"]) == LRS, frame  # every point, once
    assert set(frame["state"]) <= {"finished", "requeued"}, frame
    trained = [d for d in folder.root.glob("trial-*") if (d / "run.json").exists() and Run.load(d).metrics().size]
    assert len(trained) == 2, (trained, frame)  # no point trained twice, by a trial left behind
    if point in ("submit.controller", "submit.started", "sweep.submitted"):  # started: followed again, not run twice
        assert len(frame) == 2 and frame.loc[frame["number"] == 0, "state"].item() == "finished", frame
    for each in folder.root.glob("trial-*"):
        assert_nothing_left(each)
