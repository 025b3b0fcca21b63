"""Run history and comparison over run folders written as the ranks write them (no processes)."""
from __future__ import annotations

import pytest

import workbench
from tests.support.lifecycle import ENDLESS, wait_for_step
from workbench.config import JobConfig

pytestmark = pytest.mark.timeout(60)



@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_runs_widget_cancels_and_resumes_a_real_run(tmp_path):
    from workbench.ui import RunsView

    cfg = JobConfig.from_dict({"task": {"options": {"n_train": 256, "n_val": 32}},
                               "train": {"micro_batch_size": 16, **ENDLESS, "checkpoint_every_steps": 5},
                               "dist": {"procs_per_node": 2, "threads_per_rank": 1},
                               "launch": {"run_root": str(tmp_path)}})
    run = workbench.submit(cfg)  # only the Cancel button and resumed.cancel() end it
    wait_for_step(run, 12)
    view = RunsView(tmp_path)
    view.select.value = (str(run.folder),)
    view.buttons["Cancel"].click()
    assert f"cancelled {run.folder.name}" in view.message.value
    assert run.wait(timeout=120).state == "cancelled"
    stopped_at = int(run.metrics()["step"].max())
    view.buttons["Resume"].click()
    assert "resumed" in view.message.value, view.message.value
    resumed = view.dashboard.run
    wait_for_step(resumed, stopped_at + 1)  # it went on from its checkpoint, in the same folder
    assert resumed.folder == run.folder and len(workbench.runs(tmp_path)) == 1
    view.dashboard.stop()
    resumed.cancel()
    assert resumed.wait(timeout=120).state == "cancelled"

