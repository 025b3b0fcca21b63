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

