"""workbench.ui: the config form, the scaling view, the dashboard (on real 2-rank runs), the app,
and the import rules (``import workbench`` never loads ipywidgets; without it, workbench.ui says
how to install it and plotting still works)."""
from __future__ import annotations

import functools
import html

import pytest

import workbench
from tests.support.runs import PNG_MAGIC, tiny_cfg
from tests.support.tasks_for_tests import failing_at, fn_for_the_widget, gated
from workbench.launch.status import TERMINAL
from workbench.ui import Dashboard, Workbench


def read_meta_pool(run) -> str:
    return run.meta["pool"]["name"]



# --- Dashboard on real runs ------------------------------------------------------------------------
@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_dashboard_of_a_finished_run_shows_plot_badges_and_full_progress(tmp_path):
    gate = tmp_path / "gate"  # the run cannot end before the test has seen the dashboard poll a live run
    run = workbench.submit(tiny_cfg(tmp_path), task=functools.partial(gated, str(gate), 4, n_train=512, n_val=64))
    dash = Dashboard(run)
    # the constructor returned while the run still goes on: the poller works in the background
    assert dash.running and run.status().state not in TERMINAL
    gate.touch()
    assert run.wait(timeout=180).state == "finished", run.exception()
    dash._thread.join(timeout=120)  # a bound on a hang, not a speed: a refresh draws, seconds at load 7
    assert not dash.running, f"the poller stops by itself once the run is done; its last state: {dash.state}"
    state = dash.refresh()
    assert dash.plot.live.full_draws >= 1 and dash.plot.live.png().startswith(PNG_MAGIC)
    assert {line.get_label() for line in dash.plot.live.fig.axes[0].lines} >= {"rank 0", "rank 1"}
    assert [b.state for b in state.badges] == ["finished", "finished"]
    assert dash.badges.value.count("wb-finished") == 2
    assert dash.progress.value == dash.progress.max == state.total_steps and state.progress == 1.0
    assert dash.progress.bar_style == "success" and dash.cancel_button.disabled
    assert set(state.frame["rank"]) == {0, 1} and state.frame["step"].max() == state.total_steps
    assert dash.failure.layout.display == "none"
    shown = run.logs(0)  # the log panel shows rank 0's own output (logs/rank0.log), launcher lines apart
    assert (html.escape(shown[-2000:]) if shown else "(no output yet)") in dash.log.value
    assert "application/vnd.jupyter.widget-view+json" in dash._repr_mimebundle_()



@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_workbench_submit_of_a_failing_run_shows_the_failing_rank_traceback(tmp_path):
    app = Workbench(tiny_cfg(tmp_path), task=functools.partial(failing_at, 5, n_train=512, n_val=64))
    run = app.submit()
    assert run is not None and app.run is run and app.run_box.children == (app.dashboard.widget,)
    assert run.wait(timeout=180).state == "failed"
    state = app.dashboard.refresh()
    assert state.failed_rank == 1 and "injected failure on rank 1" in state.failure
    assert "Traceback" in app.dashboard.failure.value and app.dashboard.failure.layout.display != "none"
    assert app.dashboard.rank_select.value == 1 and app.dashboard.progress.bar_style == "danger"
    assert "wb-failed" in app.dashboard.badges.value



@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_cancel_button_stops_the_run(tmp_path):
    from tests.support.lifecycle import ENDLESS, wait_until

    run = workbench.submit(tiny_cfg(tmp_path, **ENDLESS))  # only the button ends it
    dash = Dashboard(run, poll_s=0.3)
    wait_until(lambda: dash.state is not None and dash.state.step >= 2, 120, "the dashboard shows step 2")
    dash.cancel_button.click()
    assert run.wait(timeout=120).state == "cancelled"
    dash._thread.join(timeout=15)
    assert dash.state.state == "cancelled" and dash.progress.bar_style == "warning"



@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_workbench_submits_a_training_function_on_every_rank(tmp_path):
    app = Workbench(tiny_cfg(tmp_path), fn=fn_for_the_widget, args=(8,), kwargs={"scale": 2.0})
    assert "function: fn_for_the_widget (runs on every rank)" in app.status.value
    run = app.submit()
    assert run is not None and run.wait(timeout=180).state == "finished", run.exception()
    assert run.results() == [0, 1]
    assert run.metrics().groupby("rank")["step"].max().tolist() == [8, 8]
    state = app.dashboard.refresh()
    assert [b.state for b in state.badges] == ["finished", "finished"]



@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_keep_ranks_warm_submits_through_one_pool_and_closes_it(tmp_path):
    from tests.support.lifecycle import run_processes

    app = Workbench(tiny_cfg(tmp_path), fn=fn_for_the_widget, args=(4,))
    assert app.close_pool_button.layout.display == "none"
    app.keep_warm.value = True
    first = app.submit()
    assert first is not None and first.wait(timeout=180).state == "finished", first.exception()
    pool = app.pool
    assert pool is not None and pool.alive() and app.close_pool_button.layout.display == ""
    second = app.submit()
    assert second.wait(timeout=60).state == "finished" and app.pool is pool
    assert second.results() == [0, 1] and first.folder != second.folder
    assert read_meta_pool(second) == pool.name
    app.close_pool_button.click()
    assert app.pool is None and app.close_pool_button.layout.display == "none"
    assert not pool.alive() and not run_processes(pool.dir.root)

