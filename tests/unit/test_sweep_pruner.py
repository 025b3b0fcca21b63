"""Which trials a sweep stops, and what it says about them (no processes; Optuna's own studies):
a grid runs every point unless a pruner is asked for, a sampled search prunes only once 5 trials
finished (Optuna's default), and a pruned trial's record, the sweep view and `workbench sweep` say
when and why, in the pruner's own terms.  The real thing: tests/ddp/test_sweep.py."""

from __future__ import annotations

import math
import time

import pandas as pd
import pytest

import workbench
from tests.support.runs import write_run
from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.launch.run import Run
from workbench.sweeps import space as sp
from workbench.sweeps.study import STARTUP_TRIALS, make_pruner, make_sampler, pruner_text, why_pruned

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.timeout(60)

GRID = sp.normalised({"train.lr": [1e-3, 1e-2]})
SAMPLED = sp.normalised({"train.lr": sp.loguniform(1e-4, 1e-2)})


def _cfg(tmp_path) -> JobConfig:
    return JobConfig().replace(launch__run_root=str(tmp_path / "runs"))


def _study(pruner, direction: str = "minimize"):
    return optuna.create_study(direction=direction, pruner=pruner)


def _finished(study, *values: float, step: int = 10) -> None:
    for value in values:
        trial = study.ask()
        trial.report(value, step)
        study.tell(trial, value)


def test_a_grid_prunes_nothing_unless_a_pruner_is_asked_for():
    grid = make_sampler(None, GRID)
    assert isinstance(make_pruner(None, grid), optuna.pruners.NopPruner)
    assert isinstance(make_pruner("median", grid), optuna.pruners.MedianPruner)  # asked for: it prunes a grid too
    study = _study(make_pruner(None, grid))
    _finished(study, 1.0, 1.1, 0.9, 1.0, 1.2, 1.0)
    losing = study.ask()
    losing.report(50.0, 10)
    assert not losing.should_prune()


@pytest.mark.parametrize("name", [None, "median", "percentile"])
def test_a_sampled_search_prunes_only_once_five_trials_finished(name):
    assert optuna.pruners.MedianPruner()._n_startup_trials <= STARTUP_TRIALS  # no fewer than Optuna's default
    study = _study(make_pruner(name, make_sampler(None, SAMPLED)))
    _finished(study, 1.0, 1.1, 0.9, 1.0)
    losing = study.ask()
    losing.report(5.0, 10)
    assert not losing.should_prune()  # 4 finished: too few to judge by
    _finished(study, 1.2)
    assert losing.should_prune()


def test_why_a_trial_was_pruned_is_the_comparison_its_pruner_made():
    study = _study(make_pruner(None, make_sampler(None, SAMPLED)))
    _finished(study, 1.0, 1.1, 0.9, 1.0, 1.2)
    losing = study.ask()
    losing.report(5.0, 10)
    assert losing.should_prune()
    assert why_pruned(study, losing.number, "val_loss") == (
        "pruned at step 10: val_loss 5 worse than the median 1 of 5 finished trials at that step (MedianPruner)")
    improving = study.ask()  # the pruner compares the trial's best so far
    improving.report(1.5, 5)
    improving.report(3.0, 10)
    assert improving.should_prune()
    assert why_pruned(study, improving.number, "val_loss").startswith(
        "pruned at step 10: val_loss 3, its best 1.5, worse than the median 1 of 5 finished trials")


def test_a_maximized_metric_is_judged_against_the_mirrored_percentile():
    study = _study(optuna.pruners.PercentilePruner(25.0, n_startup_trials=1), direction="maximize")
    _finished(study, 0.2, 0.4, 0.6, 0.8, 1.0)
    losing = study.ask()
    losing.report(0.1, 10)
    assert losing.should_prune()
    assert why_pruned(study, losing.number, "val_accuracy") == (
        "pruned at step 10: val_accuracy 0.1 worse than the 75th percentile 0.8 of 5 finished trials at that step "
        "(PercentilePruner)")


def test_a_threshold_a_nan_and_any_other_pruner_say_step_value_and_name():
    study = _study(optuna.pruners.ThresholdPruner(upper=5.0))
    above, nan = study.ask(), study.ask()
    above.report(9.0, 3)
    nan.report(math.nan, 4)
    assert above.should_prune() and nan.should_prune()
    assert why_pruned(study, above.number, "loss") == (
        "pruned at step 3: loss 9 above the upper bound 5 (ThresholdPruner)")
    assert why_pruned(study, nan.number, "loss") == "pruned at step 4: loss is NaN (ThresholdPruner)"
    other = _study(optuna.pruners.HyperbandPruner())
    trial = other.ask()
    trial.report(2.5, 7)
    assert why_pruned(other, trial.number, "loss") == "pruned at step 7: loss 2.5 (HyperbandPruner)"


def test_the_pruner_is_said_as_it_runs():
    assert pruner_text(optuna.pruners.NopPruner()) == "none (every trial runs to its end)"
    assert pruner_text(make_pruner("median", make_sampler(None, GRID))) == "median, once 5 trials finished"
    assert pruner_text(make_pruner("percentile", make_sampler(None, GRID))) == "percentile 25, once 5 trials finished"
    assert pruner_text(optuna.pruners.ThresholdPruner(upper=1.0)) == "ThresholdPruner"


def test_a_sweep_records_the_pruner_that_runs_and_a_resume_keeps_it(tmp_path):
    grid = workbench.sweep(_cfg(tmp_path), {"train.lr": [1e-3, 1e-2]}, name="grid", background=False)
    sampled = workbench.sweep(_cfg(tmp_path), {"train.lr": workbench.sweeps.loguniform(1e-4, 1e-2)}, trials=8,
                              name="sampled", background=False)
    asked = workbench.sweep(_cfg(tmp_path), {"train.lr": [1e-3, 1e-2]}, pruner="median", name="asked",
                            background=False)
    for made, label, kind in ((grid, "none", optuna.pruners.NopPruner),
                              (sampled, "median", optuna.pruners.MedianPruner),
                              (asked, "median", optuna.pruners.MedianPruner)):
        assert (made.dir.read_meta() or {})["pruner"] == label and isinstance(made.study.pruner, kind)
        again = workbench.Sweep.load(made.folder, resume=False)
        assert isinstance(again.study.pruner, kind) and again.pruner == made.pruner
    assert grid.pruner == "none (every trial runs to its end)"
    assert sampled.pruner == "median, once 5 trials finished"


def test_a_bad_pruner_name_is_one_line_and_makes_nothing(tmp_path):
    with pytest.raises(ConfigError) as err:
        workbench.sweep(_cfg(tmp_path), {"train.lr": [1e-3, 1e-2]}, pruner="sometimes", background=False)
    assert err.value.problems == ["pruner: 'sometimes' is not one of median, percentile, hyperband, none; or pass "
                                  "an Optuna pruner"]
    assert not (tmp_path / "runs").exists()


def _pruned_sweep(tmp_path):
    """A grid of two with median asked for: trial 0 finished, trial 1 pruned by the driver at step 3."""
    from workbench.sweeps.views import Active

    sweep = workbench.sweep(_cfg(tmp_path), {"train.lr": [1e-3, 1e-2]}, pruner="median", name="s",
                            background=False)
    first = sweep.study.ask()
    first.suggest_categorical("train.lr", [1e-3, 1e-2])
    first.set_user_attr("run_dir", str(write_run(sweep.folder, "trial-0", world=1, rule="linear", steps=3)))
    first.report(1.0, 3)
    sweep.study.tell(first, 1.0)
    second = sweep.study.ask()
    second.suggest_categorical("train.lr", [1e-3, 1e-2])
    second.set_user_attr("run_dir", str(write_run(sweep.folder, "trial-1", world=1, rule="linear", steps=3)))
    second.report(9.0, 3)
    run = Run.load(sweep.folder / "trial-1")
    sweep.active[1] = Active(second, run, time.time(), reported=3, last=9.0)
    sweep._prune(1, sweep.active[1])
    return sweep, run


WHY = "pruned at step 3: val_loss 9 worse than the median 1 of 1 finished trial at that step (MedianPruner)"


def test_a_pruned_trials_record_its_row_and_the_sweep_view_say_when_and_why(tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.ui.sweepview import SweepView

    sweep, run = _pruned_sweep(tmp_path)
    assert run.meta["pruned"]["why"] == WHY and run.meta["pruned"]["pruner"] == "MedianPruner"
    assert run.meta["pruned"]["step"] == 3
    assert sweep.study.get_trials()[1].user_attrs["why"] == WHY and sweep.events[-1] == f"trial 1 {WHY}"
    frame = sweep.frame().set_index("number")
    assert frame.loc[1, "state"] == "pruned" and frame.loc[1, "note"] == WHY and pd.isna(frame.loc[0, "note"])
    view = SweepView(sweep, start=False)
    assert "pruner median, once 5 trials finished" in view.title.value
    assert WHY in view.table.value


def test_workbench_sweep_says_its_pruner_and_why_each_trial_was_pruned(tmp_path, capsys):
    from workbench.cli import main

    sweep, _ = _pruned_sweep(tmp_path)
    sweep.dir.update_meta(driver=None)  # this process made it: no driver to wait for
    capsys.readouterr()
    assert main(["sweep", "--resume", str(sweep.folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "[sweep] pruner: median, once 5 trials finished" in lines
    assert f"[sweep] trial 1 {WHY}" in lines
    assert lines[-1].startswith("[sweep] best: trial 0")
    table = lines[lines.index(next(line for line in lines if line.lstrip().startswith("number"))):]
    assert not any(WHY in line for line in table[:3])  # the table itself stays narrow: the why is its own line
