"""The form parses numbers strictly and writes problems under the field; the scaling table says when
it is stale, highlights the config's own rule and notes what accumulation does; Submit makes one
run per click, however fast the clicks come."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from workbench.config import JobConfig
from workbench.ui import Workbench


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_a_double_click_on_submit_makes_one_run_and_every_dashboard_stays_reachable(tmp_path: Path):
    cfg = JobConfig.from_dict({"task": {"options": {"n_train": 256, "n_val": 32}},
                               "train": {"micro_batch_size": 16, "max_steps": 5},
                               "dist": {"procs_per_node": 2, "threads_per_rank": 1},
                               "launch": {"run_root": str(tmp_path)}})
    app = Workbench(cfg)
    app._on_click(app.submit_button)
    assert app.submit_button.disabled  # at once, before the submission is done
    app._on_click(app.submit_button)  # the second click of a double-click
    deadline = time.monotonic() + 60
    while app._submitting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not app.submit_button.disabled
    app._clicked_at = time.monotonic() - 0.7  # the double-click's second click, sent late by a busy browser,
    app._on_click(app.submit_button)  # arriving 0.7 s after the first, once the submission has ended
    assert not app._submitting
    assert len(app.runs) == 1 and len(list(tmp_path.glob("*/run.json"))) == 1
    first = app.run
    second = app.submit()  # a deliberate second run
    assert second is not None and len(app.runs) == 2 and app.picker.layout.display == ""
    app.picker.value = str(first.folder)
    assert app.run is first and app.run_box.children == (app.dashboards[str(first.folder)].widget,)
    for run in app.runs:
        assert run.wait(timeout=180).state == "finished", run.exception()



@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_the_scaling_tables_speed_columns_are_predicted_in_the_background_and_said_meanwhile(tmp_path: Path,
                                                                                           monkeypatch):
    """Ticking "speed" starts the plan's probe in a thread: the table stays live (a change of lr redraws it
    at once), a note says it is predicting, and the step time, samples/s and epoch time arrive per world size."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the link probe's cache: this test's own
    cfg = JobConfig.from_dict({"task": {"options": {"n_train": 256, "n_val": 32}},
                               "train": {"micro_batch_size": 16, "epochs": 2},
                               "dist": {"procs_per_node": 2, "threads_per_rank": 1},
                               "launch": {"run_root": str(tmp_path)}})
    app = Workbench(cfg)
    view = app.scaling
    view.world_sizes.value = "1,2,4"
    view.speed.value = True
    assert "speed: predicting at world sizes 1, 2, 4" in view.note.value
    lr = app.form.widget_for("train.lr")
    lr.value = "0.002" if isinstance(lr.value, str) else 0.002  # the table follows the form while the probe runs
    assert app.form.config.train.lr == 0.002 and "0.002" in view.table.value, view.table.value
    deadline = time.monotonic() + 240
    while "step_s" not in view.frame and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = view.frame.set_index("world_size")
    assert (rows["step_s"] > 0).all() and (rows["samples_per_s"] > 0).all(), view.note.value
    assert (rows["epoch_s"] > 0).all() and "predicted by workbench.plan" in view.note.value
    assert "<th" in view.table.value and "step_s" in view.table.value.replace("<wbr>", "")
    view.world_sizes.value = "1,2,4"  # unchanged: the prediction is kept, not measured again
    assert view._predicting is None and "step_s" in view.frame
