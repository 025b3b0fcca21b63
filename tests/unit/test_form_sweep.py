"""The Workbench form as a sweep (no process starts here): a field's text with several values ("1e-3,
3e-3" or "loguniform(1e-4, 1e-2)", as the CLI's --grid/--search write them) becomes the sweep's
space; every value is checked like a single value (one line per bad value, under its field); the
form says how many trials, the button says "Sweep N trials", the controls ask for trials where a
range needs them, and one value again is a plain Submit."""
from __future__ import annotations

import pytest

from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.sweeps.space import Distribution, loguniform, parse_assignment
from workbench.ui import ConfigForm, Workbench
from workbench.ui.fields import config_fields
from workbench.ui.sweepform import read_options, sweepable

pytestmark = pytest.mark.timeout(60)


def _app(tmp_path, **sections) -> Workbench:
    return Workbench(JobConfig.from_dict({"launch": {"run_root": str(tmp_path / "runs")}, **sections}))


@pytest.mark.parametrize(("path", "text", "space"), [
    ("train.lr", "1e-3, 3e-3, 1e-2", [1e-3, 3e-3, 1e-2]),
    ("train.lr", "1e-3,3e-3", [1e-3, 3e-3]),
    ("train.lr", "loguniform(1e-4, 1e-2)", loguniform(1e-4, 1e-2)),
    ("dist.procs_per_node", "1, 2", [1, 2]),
    ("train.micro_batch_size", "int_range(8, 32, 8)", Distribution("int", 8.0, 32.0, 8)),
    ("train.max_steps", "10, 20", [10, 20]),  # an Optional[int]: a YAML text field
])
def test_a_field_with_several_values_is_the_sweeps_space_read_as_the_cli_reads_it(path, text, space):
    form = ConfigForm()
    form.widget_for(path).value = text
    assert form.problems == []
    assert form.space == {path: space} == {path: parse_assignment(f"{path}={text}")[1]}
    first = space[0] if isinstance(space, list) else space.corners()[0]
    assert form.config == form.last_valid and _get(form.config, path) == first  # the first point


def _get(cfg, path):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_one_value_is_one_config_and_text_fields_are_never_swept():
    form = ConfigForm()
    form.widget_for("train.lr").value = "5e-4"
    form.widget_for("launch.name").value = "a,b"  # a text field: its own rules, not a sweep
    assert form.space == {}
    assert not sweepable(next(s for s in config_fields() if s.path == "launch.executor"))


def test_a_choice_field_switched_to_several_values_sweeps_them_and_back():
    form = ConfigForm()
    row = form.rows["train.optimizer"]
    row.several.value = True
    assert row.values.value == "adamw" and row.widget.layout.display == "none"  # starts from the dropdown's value
    row.values.value = "adamw, sgd"
    assert form.space == {"train.optimizer": ["adamw", "sgd"]}
    row.values.value = "adamw, rmsprop"
    assert form.problems == ["train.optimizer: unknown value 'rmsprop'; choose one of adamw, sgd (one of the swept "
                             "values)"]
    assert "rmsprop" in form.rows["train.optimizer"].error.value  # written under its field
    row.values.value = "sgd"  # one value: one config
    assert form.space == {} and form.config.train.optimizer == "sgd"
    row.several.value = False
    assert form.space == {} and form.problems == [] and row.widget.layout.display == ""
    assert row.widget.value == "sgd" and form.config.train.optimizer == "sgd"  # the value typed stays


def test_every_bad_value_is_one_line_under_its_field():
    form = ConfigForm()
    form.widget_for("train.lr").value = "-1, 2e-3, abc"
    form.widget_for("train.micro_batch_size").value = "0, 16, 2.5"
    assert form.problems == [
        "train.micro_batch_size: must be a positive whole number, got 0; set the per-rank batch, e.g. 32 (one of "
        "the swept values)",
        "train.micro_batch_size: expected a whole number, got 2.5; write it in digits without a fraction, e.g. 2 "
        "(one of the swept values)",
        "train.lr: must be > 0, got -1.0; typical AdamW values are 1e-4 to 1e-3 (one of the swept values)",
        "train.lr: expected a number, got 'abc'; write it in digits, e.g. 0.001 or 3e-4 (one of the swept values)",
    ]
    assert form.last_valid == JobConfig()  # nothing changed behind the user's back
    errors = form.rows["train.lr"].error
    assert errors.layout.display != "none" and errors.value.count("wb-field-error") == 2


@pytest.mark.parametrize(("path", "text", "problem"), [
    ("train.lr", "1e-3,", "train.lr: '1e-3,' has an empty value between commas; write the values apart, e.g. 1e-3, "
                          "3e-3"),
    ("train.lr", "1e-3, 1e-3", "train.lr: 0.001 is given twice; give each value once"),
    ("train.lr", "loguniform(1e-2, 1e-4)", "train.lr: loguniform(0.01, 0.0001): give numbers with 0 < low < high, "
                                           "e.g. loguniform(1e-4, 1e-2)"),
    ("train.lr", "loguniform(1e-4)", "train.lr: loguniform takes two numbers, e.g. loguniform(1e-4,1e-2)"),
    ("train.lr", "1e-3, [1", "train.lr: a value is not valid YAML"),
    ("train.micro_batch_size", "uniform(1, 4)", "train.micro_batch_size: takes whole numbers; write int_range(1, 4) "
                                                "instead of uniform(1, 4)"),
    ("dist.procs_per_node", "int_range(1.5, 3)", "dist.procs_per_node: int_range(1.5, 3, step=1): give whole "
                                                 "numbers low <= high"),
])
def test_a_badly_written_sweep_is_one_line_naming_the_field(path, text, problem):
    form = ConfigForm()
    form.widget_for(path).value = text
    assert len(form.problems) == 1 and form.problems[0].startswith(problem), form.problems
    assert form.space == {}


def test_a_grid_too_large_is_one_line_about_the_sweep():
    form = ConfigForm()
    form.widget_for("train.seed").value = ", ".join(str(i) for i in range(101))
    form.widget_for("train.warmup_steps").value = ", ".join(str(i) for i in range(100))
    assert form.problems == ["sweep: the grid has 10100 points (more than 10000); use fewer values or a distribution "
                             "with trials=N"]


def test_the_form_says_how_many_trials_and_the_button_sweeps_them(tmp_path):
    app = _app(tmp_path)
    assert app.submit_button.description == "Submit" and app.sweep_controls.layout.display == "none"
    app.form.widget_for("train.lr").value = "1e-3, 3e-3, 1e-2"
    app.form.widget_for("dist.procs_per_node").value = "1, 2"
    assert app.submit_button.description == "Sweep 6 trials" and app.sweep_controls.layout.display == ""
    assert "sweep: 3 x 2 = 6 trials (train.lr, dist.procs_per_node)" in app.sweep_note.value
    assert "the table shows the first point (train.lr=0.001, dist.procs_per_node=1)" in app.sweep_note.value
    assert app.scaling.frame.query("selected")["world_size"].tolist() == [1]  # the first point's table
    app.trials.value = "4"
    assert app.submit_button.description == "Sweep 4 trials" and "sweep: 4 of 6 trials" in app.sweep_note.value
    app.form.widget_for("train.lr").value = "1e-3"
    app.form.widget_for("dist.procs_per_node").value = "2"  # one value again: a plain submit
    assert app.submit_button.description == "Submit" and app.sweep_controls.layout.display == "none"
    assert app.sweep_note.layout.display == "none"


def test_a_range_needs_trials_and_the_controls_are_read_strictly(tmp_path):
    app = _app(tmp_path)
    app.form.widget_for("train.lr").value = "loguniform(1e-4, 1e-2)"
    assert app.submit_button.description == "Sweep"
    assert "trials: a range is sampled; give how many trials to run, e.g. 8" in app.sweep_problems.value
    app.trials.value = "8"
    assert app.submit_button.description == "Sweep 8 trials" and app.sweep_problems.value == ""
    assert "sweep: 8 trials sampled (train.lr loguniform(0.0001, 0.01))" in app.sweep_note.value
    app.parallel.value = "two"
    assert "parallel: expected a whole number &gt;= 1 (e.g. 2), got &#x27;two&#x27;" in app.sweep_problems.value


@pytest.mark.parametrize(("trials", "parallel", "metric", "problem"), [
    ("", "1", "val_loss", "trials: a range is sampled; give how many trials to run, e.g. 8"),
    ("0", "1", "val_loss", "trials: expected a whole number >= 1 (e.g. 2), got '0'"),
    ("2.5", "1", "val_loss", "trials: expected a whole number >= 1 (e.g. 2), got '2.5'"),
    ("4", "0", "val_loss", "parallel: expected a whole number >= 1 (e.g. 2), got '0'"),
    ("4", "1", " ", "metric: give the metric to optimise and prune on, e.g. val_loss or loss"),
])
def test_each_bad_control_is_one_line_naming_it(trials, parallel, metric, problem):
    options, problems = read_options({"train.lr": loguniform(1e-4, 1e-2)}, trials, parallel, metric)
    assert options is None and problems == [problem]


def test_more_trials_than_the_grid_has_is_refused_and_empty_means_every_point():
    assert read_options({"train.lr": [1e-3, 3e-3]}, "3", "", "loss")[1] == [
        "trials: the grid has 2 points; give at most 2, or leave it empty for all"]
    options, problems = read_options({"train.lr": [1e-3, 3e-3]}, "", "", "loss")
    assert problems == [] and (options.trials, options.parallel, options.metric) == (None, 1, "loss")


def test_a_sweep_with_problems_starts_nothing_and_says_why(tmp_path):
    app = _app(tmp_path)
    app.form.widget_for("train.lr").value = "loguniform(1e-4, 1e-2)"  # no trials given
    assert app.sweep() is None
    assert "sweep not started" in app.status.value and app.run_box.children == ()
    assert "trials: a range is sampled" in app.form.problems_html.value
    assert not list(tmp_path.rglob("sweep-*"))  # no sweep folder made
    app.form.widget_for("train.lr").value = "1e-3, 3e-3"
    app.metric.value = ""
    assert app.sweep() is None and "metric: give the metric" in app.form.problems_html.value
    assert not list(tmp_path.rglob("sweep-*"))


def test_submit_and_save_refuse_several_values_with_one_line(tmp_path):
    app = _app(tmp_path)
    app.form.widget_for("train.lr").value = "1e-3, 3e-3"
    assert app.submit() is None
    assert "train.lr: several values make a sweep; click Sweep" in app.form.problems_html.value
    with pytest.raises(ConfigError, match=r"train.lr: holds several values \(a sweep\) and a YAML file holds one "):
        app.form.save_yaml(tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml").exists()


def test_loading_a_config_turns_the_form_back_into_one_config():
    form = ConfigForm()
    form.widget_for("train.lr").value = "1e-3, 3e-3"
    form.rows["train.schedule"].several.value = True
    form.rows["train.schedule"].values.value = "constant, cosine"
    assert set(form.space) == {"train.lr", "train.schedule"}
    form.set_config(JobConfig.from_dict({"train": {"lr": 2e-3}}))
    assert form.space == {} and form.config.train.lr == 2e-3 and not form.rows["train.schedule"].several.value


def _train(steps: int = 10, lr: float = 1e-3) -> None:
    """A training function for Workbench(fn=...): it reads dist.* and launch.*, not train.*."""


def test_a_field_the_swept_function_never_reads_is_one_line_under_it(tmp_path):
    app = Workbench(JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}), fn=_train, kwargs={"steps": 5})
    app.form.widget_for("train.lr").value = "1e-3, 3e-3"
    assert app.form.problems == ["train.lr: a function does not read the train section (only dist.* and launch.* "
                                 "reach it); sweep its own argument instead, e.g. 'fn.lr'"]  # once, not per value
    assert "wb-field-error" in app.form.rows["train.lr"].error.value
    app.form.widget_for("train.lr").value = "1e-3"
    app.form.widget_for("dist.procs_per_node").value = "1, 2"  # the function's world size: it is swept
    assert app.form.problems == [] and app.submit_button.description == "Sweep 2 trials"
