"""What a sweep reads from a trial's run folder, on folders written as the ranks write them (no
processes): the metric's values by step (eval events, or logged records reduced across ranks), and
a pruned trial's run in the state "pruned" wherever a run's state is shown."""

from __future__ import annotations

import pytest

import workbench
from tests.support.runs import write_run
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir
from workbench.sweeps.views import metric_values

pytestmark = pytest.mark.timeout(60)


def test_an_eval_metric_is_read_from_the_eval_events(tmp_path):
    run = Run.load(write_run(tmp_path, "trial-0", world=2, rule="linear"))
    assert metric_values(run, "val_loss") == [(20, pytest.approx(1 / 40)), (40, pytest.approx(1 / 80))]
    assert metric_values(run, "val_accuracy") == [(20, pytest.approx(0.7)), (40, pytest.approx(0.9))]


def test_a_logged_metric_is_read_reduced_once_per_step(tmp_path):
    run = Run.load(write_run(tmp_path, "trial-0", world=2, rule="linear", steps=5))
    values = metric_values(run, "loss")
    assert [s for s, _ in values] == [1, 2, 3, 4, 5]
    assert values[0][1] == pytest.approx(2.0 / 2 + 0.1)


def test_a_metric_the_run_does_not_log_reads_as_nothing_yet(tmp_path):
    run = Run.load(write_run(tmp_path, "trial-0", world=1, rule="linear", steps=3))
    assert metric_values(run, "val_f1") == [] and metric_values(run, "perplexity") == []


def _pruned_and_cancelled(tmp_path) -> tuple[RunDir, RunDir]:
    run = RunDir(write_run(tmp_path, "trial-0", world=1, rule="linear", steps=3, final="cancelled"))
    why = "pruned at step 3: loss 9 above the upper bound 5 (ThresholdPruner)"
    run.update_meta(pruned={"step": 3, "value": 9.0, "time": 0.0, "sweep": str(tmp_path / "sweep-s"), "why": why})
    run.mark_cancelled(f"sweep sweep-s: {why}")
    other = RunDir(write_run(tmp_path, "other", world=1, rule="linear", steps=3, final="cancelled"))
    other.mark_cancelled("Run.cancel()")
    return run, other


def test_a_pruned_trials_run_is_pruned_wherever_its_state_is_shown(tmp_path, capsys):
    from workbench.cli import main
    from workbench.ui.dashboard import BAR_STYLES
    from workbench.ui.state import read_state

    pruned, cancelled = _pruned_and_cancelled(tmp_path)
    listed = workbench.runs(tmp_path).set_index("name")["status"]
    assert listed.to_dict() == {"trial-0": "pruned", "other": "cancelled"}
    run = Run.load(pruned.root)
    status = run.status()
    assert status.state == "pruned" and status.done and status.progress_line().startswith("pruned · step 3/3")
    assert run.wait(timeout=5).state == "pruned"  # an ended state: wait returns
    assert read_state(run).state == "pruned" and BAR_STYLES["pruned"] == BAR_STYLES["cancelled"]
    assert Run.load(cancelled.root).status().state == "cancelled"
    capsys.readouterr()
    assert main(["show", str(pruned.root)]) == 0
    out = capsys.readouterr().out
    assert f"run {pruned.root}: pruned · step 3/3" in out
    assert "[workbench] pruned at step 3: loss 9 above the upper bound 5 (ThresholdPruner) (sweep sweep-s)" in out


def test_following_a_pruned_trial_exits_0_a_cancelled_run_1(tmp_path, capsys):
    """A losing trial stopped by its sweep is not a failure (`workbench --help`'s exit codes)."""
    from workbench.cli import main

    pruned, cancelled = _pruned_and_cancelled(tmp_path)
    assert main(["follow", str(pruned.root)]) == 0
    assert "[workbench] pruned (step 3/3" in capsys.readouterr().out
    assert main(["follow", str(cancelled.root)]) == 1


def test_a_run_resumed_in_a_pruned_trials_folder_is_no_longer_pruned(tmp_path):
    pruned, _ = _pruned_and_cancelled(tmp_path)
    pruned.update_meta(pruned.forget_last_attempt)
    assert "pruned" not in (pruned.read_meta() or {}) and "cancelled" not in (pruned.read_meta() or {})


def test_a_trial_being_started_is_listed_once_its_run_json_is_written(tmp_path):
    """The driver makes a trial's run folder before it writes run.json (on SLURM, when an element
    is bound); sweep.runs read in between lists the trials that started, never raises."""
    optuna = pytest.importorskip("optuna")
    from workbench.config.sections import JobConfig
    from workbench.runfolder.layout import SweepDir
    from workbench.sweeps.driver import Sweep

    study = optuna.create_study()
    study.ask().set_user_attr("run_dir", str(write_run(tmp_path, "trial-0", world=1, rule="linear", steps=3)))
    being_started = tmp_path / "trial-1"
    being_started.mkdir()
    study.ask().set_user_attr("run_dir", str(being_started))
    sweep = Sweep(SweepDir(tmp_path), study, {"train.lr": [1e-3, 2e-3]}, JobConfig(), trials=2, parallel=1,
                  metric="loss")
    assert [r.folder.name for r in sweep.runs] == ["trial-0"]
    write_run(tmp_path, "trial-1", world=1, rule="linear", steps=3)
    assert [r.folder.name for r in sweep.runs] == ["trial-0", "trial-1"]
