"""The form parses numbers strictly and writes problems under the field; the scaling table says when
it is stale, highlights the config's own rule and notes what accumulation does; Submit makes one
run per click, however fast the clicks come."""
from __future__ import annotations

import html
import threading

import ipywidgets as w
import pytest

from workbench.config import JobConfig
from workbench.ui import ConfigForm, ScalingView, Workbench
from workbench.ui.fields import field_spec, from_widget


@pytest.mark.timeout(60)
@pytest.mark.parametrize("typed", ["2.5", "abc", "1e3", "", "4 4"])
def test_int_fields_reject_anything_but_a_whole_number(typed):
    spec = field_spec("train.grad_accum_steps", int)
    value, problem = from_widget(spec, typed)
    assert value is None and problem.startswith("train.grad_accum_steps: expected a whole number (e.g. 4), got ")
    assert from_widget(spec, " 12 ") == (12, None) and from_widget(spec, "-3") == (-3, None)



@pytest.mark.timeout(60)
def test_a_typed_2_5_is_an_error_under_the_field_not_25():
    form = ConfigForm()
    before = form.last_valid
    widget = form.widget_for("train.grad_accum_steps")
    assert isinstance(widget, w.Text)
    widget.value = "2.5"
    row = form.rows["train.grad_accum_steps"]
    assert form.problems == ["train.grad_accum_steps: expected a whole number (e.g. 4), got '2.5'"]
    assert row.error.layout.display != "none" and "got &#x27;2.5&#x27;" in row.error.value
    assert form.last_valid == before  # nothing changed behind the user's back
    widget.value = "abc"
    assert "got &#x27;abc&#x27;" in row.error.value and widget.value == "abc"  # not silently reverted
    widget.value = "3"
    assert form.config.train.grad_accum_steps == 3 and row.error.layout.display == "none"



@pytest.mark.timeout(60)
def test_the_table_says_when_it_shows_the_last_valid_config():
    form = ConfigForm()
    view = ScalingView(form)
    assert view.stale.value == ""
    form.widget_for("train.micro_batch_size").value = "abc"
    assert "last valid config" in view.stale.value and "train.micro_batch_size" in view.stale.value
    assert view.table.layout.opacity == "0.55"
    form.widget_for("train.micro_batch_size").value = "16"
    assert view.stale.value == "" and view.table.layout.opacity == "1"



@pytest.mark.timeout(60)
def test_compare_all_rules_highlights_only_the_configs_rule_and_the_reference_batch_is_said():
    cfg = JobConfig.from_dict({"scaling": {"rule": "sqrt"}, "train": {"grad_accum_steps": 4}})
    view = ScalingView(ConfigForm(cfg))
    view.rule.value = "compare"
    chosen = view.frame[view.frame["selected"]]
    assert chosen[["world_size", "rule"]].values.tolist() == [[cfg.world_size, "sqrt"]]
    assert view.table.value.count('class="wb-selected"') == 1
    assert "wb-reference" in view.note.value and "tuned at effective batch 128" in view.note.value
    assert "sqrt(effective batch / 128)" in view.note.value


@pytest.mark.timeout(60)
def test_a_new_per_rank_batch_in_the_form_moves_lr_by_the_rule_from_the_tuned_batch():
    """The UniRef50 guide tunes lr 5e-5 at 16 x 4 x 1 = 64 and, at 8 GPUs, lowers the per-GPU batch to 12 for
    memory: effective 384, lr 3e-4 (x 6).  Typed into the form, the 12 keeps the reference at 64."""
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 16, "grad_accum_steps": 4, "lr": 5e-5,
                                         "warmup_steps": 5000}, "dist": {"procs_per_node": 8}})
    form = ConfigForm(cfg)
    view = ScalingView(form)
    form.widget_for("train.micro_batch_size").value = "12"
    assert form.config.train.lr_ref_batch == 64 and form.widget_for("train.lr_ref_batch").value == "64"
    row = view.frame[view.frame["world_size"] == 8].iloc[0]
    assert (row["effective_batch"], row["warmup_steps"]) == (384, 30000) and row["lr"] == pytest.approx(3e-4)
    form.widget_for("train.grad_accum_steps").value = "2"  # the reference stays where it was put
    assert form.config.train.lr_ref_batch == 64
    assert view.frame[view.frame["world_size"] == 8].iloc[0]["lr"] == pytest.approx(5e-5 * 12 * 2 * 8 / 64)
    form.set_config(cfg)  # a config loaded whole keeps its own (empty) reference
    assert form.config.train.lr_ref_batch is None
    form.widget_for("train.lr").value = "1e-4"  # other fields never set it
    assert form.config.train.lr_ref_batch is None



@pytest.mark.timeout(60)
def test_form_and_table_sit_side_by_side_and_the_form_scrolls_in_its_box(tmp_path):
    app = Workbench(JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}))
    top = app.widget.children[0]
    assert isinstance(top, w.HBox) and top.layout.flex_flow == "row wrap"
    form_box, side = top.children
    assert app.form.widget in form_box.children and app.scaling.widget in side.children
    assert form_box.layout.overflow == "auto" and form_box.layout.max_height



@pytest.mark.timeout(60)
def test_text_fields_reach_the_kernel_on_commit_so_a_keystroke_on_the_way_is_never_the_table():
    form = ConfigForm(JobConfig.from_dict({"train": {"micro_batch_size": 32}}))
    view = ScalingView(form)
    texts = [row.widget for row in form.rows.values() if isinstance(row.widget, w.Text)]
    assert texts and all(t.continuous_update is False for t in texts)  # Enter or leaving the field sends it
    form.widget_for("train.micro_batch_size").value = "2.5"  # what the browser sends on commit: the whole text
    assert form.last_valid.train.micro_batch_size == 32
    assert set(view.frame["micro_batch_size"]) == {32}
    assert "last valid config (valid as a whole)" in view.stale.value and "got &#x27;2.5&#x27;" in view.stale.value


@pytest.mark.timeout(60)
def test_the_stale_banner_lists_every_problem():
    form = ConfigForm()
    view = ScalingView(form)
    for path, value in (("train.micro_batch_size", "2.5"), ("train.lr", "abc"), ("train.grad_accum_steps", "x")):
        form.widget_for(path).value = value
    assert len(form.problems) == 3
    assert "3 problem(s)" in view.stale.value
    for problem in form.problems:
        assert f"<li>{html.escape(problem)}</li>" in view.stale.value
    for problem in form.problems:  # and the form's own banner
        assert f"<li>{html.escape(problem)}</li>" in form.problems_html.value


@pytest.mark.timeout(60)
def test_a_stale_not_submitted_clears_once_the_config_is_fixed(tmp_path):
    app = Workbench(JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}))
    app.form.widget_for("train.micro_batch_size").value = "0"
    app.form.widget_for("train.lr").value = "abc"
    assert app.submit() is None and "not submitted" in app.status.value  # no process: refused at validation
    app.form.widget_for("train.micro_batch_size").value = "8"
    assert "not submitted" in app.status.value  # one problem is left
    app.form.widget_for("train.lr").value = "0.01"
    assert "not submitted" not in app.status.value and "ready to submit" in app.status.value
    assert "the config is valid" in app.form.problems_html.value


def test_a_click_refused_for_problems_leaves_the_next_click_free(tmp_path):
    """The double-click window follows a click that made a run; after a refusal the user fixes the
    field and clicks again at once, and that click is taken (here: refused again, for its own reason)."""
    app = Workbench(JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}))
    app.form.widget_for("train.lr").value = "abc"
    for _ in range(2):  # no process: refused at validation, in the click's thread
        app._on_click(app.submit_button)
        for thread in [t for t in threading.enumerate() if t.name == "workbench-submit"]:
            thread.join(timeout=30)
        assert not app._submitting and "not submitted" in app.status.value
        assert app._clicked_at < 0  # the window is not held
        app.status.value = ""


def test_a_submit_or_sweep_that_fails_says_so_in_one_line_and_adds_nothing(tmp_path, monkeypatch):
    """An error that is not the config's (the disk, the scheduler) is one status line under the
    button, never a traceback in a log the user does not see; no run or sweep is added."""
    import workbench

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workbench, "submit", disk_full)
    monkeypatch.setattr(workbench, "sweep", disk_full)
    app = Workbench(JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}}))
    assert app.submit() is None and app.runs == []
    assert "submit failed: OSError: [Errno 28] No space left on device" in app.status.value
    app.form.widget_for("train.lr").value = "1e-3, 3e-3"
    assert app.sweep() is None and app.sweeps == []
    assert "sweep failed: OSError: [Errno 28] No space left on device" in app.status.value


@pytest.mark.timeout(60)
def test_the_scaling_table_scrolls_inside_its_widget_and_its_headers_wrap_at_underscores():
    view = ScalingView(ConfigForm())
    table = view.table.value
    assert table.startswith("<div class='wb-table-scroll'") and "overflow-x:auto" in table and "min-width:100%" in table
    assert "steps_<wbr>per_<wbr>epoch" in table and "title='steps_per_epoch'" in table
    assert table.count("white-space:nowrap") == table.count("<td")  # a number never wraps
    controls = view.widget.children[0]
    assert controls.layout.flex_flow == "row wrap"  # rule and world sizes stack on a narrow widget


@pytest.mark.timeout(120)
def test_the_scaling_table_shows_memory_a_rank_and_traces_once_per_model_shape():
    form = ConfigForm(JobConfig.from_dict({"task": {"options": {"n_train": 512}}, "train": {"micro_batch_size": 16}}))
    view = ScalingView(form)
    assert {"peak_mb", "fits", "max_micro_batch"} <= set(view.frame.columns) and view.frame["fits"].all()
    assert ">peak_mb<" in view.table.value.replace("_<wbr>", "_") and "wb-plan" in view.note.value
    small = view.frame["peak_mb"].iloc[0]
    form.widget_for("train.lr").value = "0.01"  # the model's shape is the same: no new trace
    assert view.traces == 1
    form.widget_for("train.micro_batch_size").value = "64"  # more activations
    assert view.traces == 2 and view.frame["peak_mb"].iloc[0] > small
    form.widget_for("task.name").value = "tests.support.tasks_for_tests:data_dependent"  # cannot be traced
    assert "could not be traced on fake tensors (DynamicOutputShapeException" in view.note.value
    assert view.frame["fits"].isna().all()
    view.plan.value = False
    assert "peak_mb" not in view.frame.columns
