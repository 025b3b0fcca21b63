"""The Workbench form's sweep for real: two learning rates in train.lr with "keep ranks warm" on run as
two trials one after another in the widget's pool (2 ranks each), the SweepView in the app follows
them to the end, and closing the pool leaves no process; the view's Cancel stops two running trials
with no process left.  (The local path, clicked in JupyterLab, is tests/browser/test_browser_sweep_form.py.)"""

from __future__ import annotations

import pytest

from tests.support.lifecycle import ENDLESS, assert_nothing_left, cfg, wait_for_step, wait_until
from workbench.ui import Workbench

pytest.importorskip("optuna")
pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]


def test_the_form_sweeps_two_lrs_through_its_warm_pool_and_its_view_follows(tmp_path):
    app = Workbench(cfg(tmp_path, max_steps=8, eval_every_steps=4, checkpoint_every_steps=None))
    app.form.widget_for("train.lr").value = "1e-3, 3e-3"
    app.keep_warm.value = True
    assert app.submit_button.description == "Sweep 2 trials"
    try:
        sweep = app.sweep()
        assert sweep is not None, app.status.value
        assert app.run_box.children == (app.sweep_view.widget,) and "sweep started" in app.status.value
        sweep.wait(timeout=240)
        frame = sweep.frame()
        assert sorted(frame["train.lr"]) == [1e-3, 3e-3] and set(frame["state"]) == {"finished"}, (frame,
                                                                                                 sweep.events)
        assert {run.meta["pool"]["name"] for run in sweep.runs} == {app.pool.name}  # the widget's warm ranks
        app.sweep_view.refresh()
        assert "done · 2/2 trials" in app.sweep_view.title.value and app.sweep_view.cancel_button.disabled
        assert app.sweep_view.table.value.count(">finished<") == 2
    finally:
        if app.sweep_view is not None:
            app.sweep_view.stop()
        pool = app.pool
        app.close_pool()
    assert pool is not None
    assert_nothing_left(pool.dir.root)


def test_the_sweep_views_cancel_in_the_app_stops_every_running_trial(tmp_path):
    """Trials that would train for ever (ENDLESS): only the Cancel button ends them."""
    app = Workbench(cfg(tmp_path, **ENDLESS, checkpoint_every_steps=None, dist={"procs_per_node": 1}))
    app.form.widget_for("train.lr").value = "1e-3, 3e-3"
    app.parallel.value = "2"
    sweep = app.sweep()
    assert sweep is not None, app.status.value
    try:
        wait_until(lambda: len(sweep.runs) == 2, 120, "both trials submitted")
        for run in sweep.runs:
            wait_for_step(run, 1)  # both train
        app.sweep_view.cancel_button.click()  # the button's own handler, as a click in the notebook runs it
        assert "cancelled: every trial's run stopped" in app.sweep_view.message.value
        assert "cancelled" in app.sweep_view.title.value and app.sweep_view.cancel_button.disabled
        assert sweep.cancelled and sweep.done
        for run in sweep.runs:
            assert run.status().state == "cancelled"
            assert_nothing_left(run.folder)
    finally:
        app.sweep_view.stop()
        if not sweep.done:
            sweep.cancel()
