"""Seeing inside the ranks: communication time, parameter sync, stragglers, shards, hangs."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import assert_nothing_left, wait_until
from tests.support.tasks_for_tests import diverging_at, failing_at, slow_on
from workbench.config import JobConfig
from workbench.engine.health import shard_report

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(180)]
OPTIONS = {"n_train": 2048, "n_val": 128}


def _cfg(tmp_path: Path, **dist) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"options": OPTIONS}, "train": {"micro_batch_size": 16, "max_steps": 30},
        "dist": {"procs_per_node": 2, "check_every_steps": 10, **dist},
        "launch": {"run_root": str(tmp_path)},
    })


def _events(run, kind):
    frame = run.events()
    return frame[frame["event"] == kind]


def test_a_healthy_run_reports_comm_time_sync_and_shards(finished_run):
    run = finished_run  # checks every 10 steps, 40 steps
    frame = run.metrics()
    assert (frame["comm_busy_s"] > 0).all() and (frame["comm_wait_s"] >= 0).all()
    assert (frame["comm_wait_s"] <= frame["step_time_s"]).all()
    checks = _events(run, "sync_check")
    assert list(checks["step"]) == [10, 20, 30, 40] and checks["in_sync"].all()
    shards = _events(run, "shard_check").iloc[0]
    assert shards["ok"] and shards["disjoint"] and shards["reshuffles"]
    assert all(r.in_sync for r in run.status().ranks)


@pytest.mark.parametrize("hook", ["fp16", "bf16"])
def test_gradient_compression_trains_in_sync(tmp_path, hook):
    run = workbench.submit(_cfg(tmp_path, comm_hook=hook))
    assert run.wait(timeout=120).state == "finished", run.exception()
    assert _events(run, "sync_check")["in_sync"].all()


def test_diverged_parameters_are_caught_and_named(tmp_path):
    run = workbench.submit(_cfg(tmp_path), task=functools.partial(diverging_at, 3, rank=1, **OPTIONS))
    assert run.wait(timeout=120).state == "finished", run.exception()
    first = _events(run, "sync_check").iloc[0]
    assert not first["in_sync"]
    assert first["diverged_ranks"] == [1] and first["first_diverged"] == "0.weight"
    assert run.status().ranks[0].in_sync is False


def test_a_straggler_is_flagged(tmp_path):
    run = workbench.submit(_cfg(tmp_path), task=functools.partial(slow_on, 1, 0.03, **OPTIONS))
    assert run.wait(timeout=120).state == "finished", run.exception()
    stragglers = _events(run, "straggler")
    assert len(stragglers) and set(stragglers["straggler_rank"]) == {1}


def test_a_hung_rank_is_named_and_every_rank_dumps_its_stacks(tmp_path):
    # the hang outlasts the test: no collective times out (timeout_s) before the cancel ends the run, and
    # on_hang=warn keeps the run going once rank 1 is named hung (tests/ddp/test_failure_causes.py: fail)
    cfg = _cfg(tmp_path, stall_after_s=3, timeout_s=600, on_hang="warn").replace(train__max_steps=1000)
    run = workbench.submit(cfg, task=functools.partial(failing_at, 5, rank=1, how="hang", **OPTIONS))
    wait_until(lambda: len(run.stacks()) >= 2, 90, "both ranks dumped their stacks")
    stacks = run.stacks()
    assert set(stacks) == {0, 1}
    assert "tasks_for_tests.py" in stacks[1] and "loss_fn" in stacks[1]
    assert "tasks_for_tests.py" not in stacks[0]  # rank 0 waits in the collective, not in user code
    assert all(r.stalled for r in run.status().ranks)
    assert run.health()["stalled_ranks"] == [0, 1]
    # the progress line says the stall (issue 28), not the rate and ETA from before it
    wait_until(lambda: "rank 1 at " in run.status().progress_line(), 30, "the stall line names rank 1's frame")
    line = run.status().progress_line()
    assert line.startswith("stalled ") and " s at step " in line, line
    # the collective rank 0 waits in, by the flight recorder's number (or "a collective" before it is read)
    assert "tasks_for_tests.py:" in line and re.search(r"rank 0 waits in (a collective|all_reduce #\d+)", line), line
    assert "steps/s" not in line and "ETA" not in line, line
    if __import__("importlib").util.find_spec("ipywidgets"):
        from workbench.ui.dashboard import Dashboard

        board = Dashboard(run, autostart=False)
        board.refresh()
        assert "stack dump of rank 1" in board.stacks.value and "stalled" in board.health.value
        assert "‖ stalled " in board.eta.value and "rank 1 at " in board.eta.value, board.eta.value
    run.cancel()
    assert run.wait(timeout=60).state == "cancelled"
    assert_nothing_left(run.folder)


def test_script_without_set_epoch_is_reported(tmp_path):
    script = SCRIPTS / "no_set_epoch.py"
    run = workbench.submit_script(script, [], JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}), nproc=2)
    assert run.wait(timeout=120).state == "finished", run.exception()
    warnings = _events(run, "warning")
    assert set(warnings["rank"]) == {0, 1} and (warnings["check"] == "set_epoch").all()


def test_shard_report_logic():
    ok = shard_report([[0, 2], [1, 3]], [True, True], 4, shuffle=True)
    assert ok["ok"] and ok["covered_fraction"] == 1.0
    overlap = shard_report([[0, 1], [1, 2]], [True, True], 4, shuffle=True)
    assert not overlap["disjoint"]
    padded = shard_report([[0, 2], [1, 0]], [True, True], 3, shuffle=True)  # 3 samples, 2 ranks: one repeat
    assert padded["disjoint"] and padded["padded"] == 1
    frozen = shard_report([[0, 2], [1, 3]], [False, False], 4, shuffle=True)
    assert frozen["disjoint"] and not frozen["reshuffles"] and not frozen["ok"]


def test_run_health_and_dashboard_show_divergence_and_stragglers(tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.ui.dashboard import Dashboard

    run = workbench.submit(_cfg(tmp_path), task=functools.partial(diverging_at, 3, rank=1, **OPTIONS))
    run.wait(timeout=120)
    run.events()  # an earlier read of the events must not hide them from health()
    health = run.health()
    assert health["in_sync"] is False and health["diverged_ranks"] == [1]
    board = Dashboard(run, autostart=False)
    board.refresh()
    assert "diverged on ranks [1]" in board.health.value and "0.weight" in board.health.value
