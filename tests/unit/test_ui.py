"""workbench.ui: the config form, the scaling view, the dashboard (on real 2-rank runs), the app,
and the import rules (``import workbench`` never loads ipywidgets; without it, workbench.ui says
how to install it and plotting still works)."""
from __future__ import annotations

import html
import subprocess
import sys
import textwrap

import ipywidgets as w
import pandas as pd
import pytest

from tests.support import REPO
from tests.support.runs import PNG_MAGIC, tiny_cfg
from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.launch.status import RankStatus, RunStatus
from workbench.ui import ConfigForm, ScalingView, Workbench
from workbench.ui.state import dashboard_state, format_eta


def leaf_paths() -> set[str]:
    docs = JobConfig.docs()
    return {p for p in docs if not any(other.startswith(p + ".") for other in docs)}



# --- imports ---------------------------------------------------------------------------------------
def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)



def fn_for_the_widget(steps: int, scale: float = 1.0) -> int:
    import torch.distributed as dist

    import workbench

    for step in range(1, steps + 1):
        workbench.log(step=step, loss=scale / step)
    return dist.get_rank()



# --- ConfigForm ------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_form_has_a_widget_with_its_doc_for_every_field_grouped_by_section():
    form = ConfigForm()
    docs = JobConfig.docs()
    assert set(form.rows) == leaf_paths()
    for path, row in form.rows.items():
        assert row.widget.tooltip == docs[path] and docs[path], path
    assert set(form.accordion.titles) >= {"task", "train", "train.early_stopping", "launch", "launch.slurm"}
    kinds = {"train.optimizer": w.Dropdown, "data.pin_memory": w.Checkbox, "train.micro_batch_size": w.Text,
             "train.lr": w.Text, "train.max_steps": w.Text, "train.optimizer_kwargs": w.Text,
             "launch.slurm.setup": w.Text}
    for path, kind in kinds.items():
        assert type(form.widget_for(path)) is kind, path
    assert form.config == JobConfig()
    assert form.problems == [] and "valid" in form.problems_html.value



@pytest.mark.timeout(60)
def test_field_kinds_and_conversions_follow_the_annotations():
    from typing import Any, Literal, Optional

    from workbench.ui.fields import field_spec, from_widget, to_widget

    choice = field_spec("a.mode", Optional[Literal["x", "y"]])
    assert (choice.kind, choice.optional) == ("choice", True)
    assert to_widget(choice, None) == "" and from_widget(choice, "") == (None, None)
    count = field_spec("a.count", Optional[int])
    assert count.kind == "yaml" and from_widget(count, "") == (None, None) and from_widget(count, "7") == (7, None)
    mapping = field_spec("a.opts", dict[str, Any])
    assert to_widget(mapping, {"b": [1, 2]}) == '{"b": [1, 2]}' and from_widget(mapping, "") == ({}, None)
    value, problem = from_widget(mapping, "{b: [1, 2}")
    assert value is None and problem.startswith("a.opts: not valid YAML or JSON")
    assert to_widget(field_spec("a.lr", float), 5e-5) == "5e-05"  # not rounded
    assert from_widget(field_spec("a.limit", str | int), "1:30:00") == ("1:30:00", None)



@pytest.mark.timeout(60)
def test_editing_widgets_changes_the_config_and_tells_observers():
    form = ConfigForm()
    seen = []
    form.observe(seen.append)
    edits = {"train.lr": "5e-5", "train.micro_batch_size": "8", "train.optimizer": "sgd", "train.max_steps": "100",
             "train.optimizer_kwargs": "{momentum: 0.9}", "data.pin_memory": True,
             "launch.time_limit": "1:30:00", "launch.slurm.setup": '["module load cuda"]'}
    for path, value in edits.items():
        form.widget_for(path).value = value
    cfg = form.config
    assert cfg.train.lr == 5e-5 and cfg.train.micro_batch_size == 8 and cfg.train.optimizer == "sgd"
    assert cfg.train.max_steps == 100 and cfg.train.optimizer_kwargs == {"momentum": 0.9}
    assert cfg.data.pin_memory is True and cfg.launch.time_limit == "1:30:00"
    assert cfg.launch.slurm.setup == ["module load cuda"]
    assert seen[-1] == cfg and len(seen) == len(edits)
    form.widget_for("train.max_steps").value = ""  # empty means None
    assert form.config.train.max_steps is None



@pytest.mark.timeout(60)
def test_invalid_values_show_the_python_validation_messages_and_mark_the_fields():
    form = ConfigForm()
    form.widget_for("train.micro_batch_size").value = "0"
    form.widget_for("train.lr").value = "-1"
    expected = pytest.raises(ConfigError, JobConfig.from_dict, {"train": {"micro_batch_size": 0, "lr": -1}}).value.problems
    assert len(expected) == 2 and form.problems == expected
    with pytest.raises(ConfigError) as err:
        form.config
    assert err.value.problems == expected
    for message in expected:
        assert html.escape(message) in form.problems_html.value
    for path in ("train.micro_batch_size", "train.lr"):
        assert "red" in form.widget_for(path).layout.border or "#d9534f" in form.widget_for(path).layout.border
        assert "✘" in form.rows[path].mark.value
    assert not form.widget_for("train.epochs").layout.border and not form.rows["train.epochs"].mark.value
    assert any("✘" in title for title in form.accordion.titles if title.startswith("train "))

    form.widget_for("train.micro_batch_size").value = "4"
    form.widget_for("train.lr").value = "abc"  # a type error: from_dict's own message
    with pytest.raises(ConfigError) as typed:
        JobConfig.from_dict({"train": {"lr": "abc"}})
    assert form.problems == typed.value.problems
    form.widget_for("train.lr").value = "0.01"
    assert form.problems == [] and not form.widget_for("train.lr").layout.border



@pytest.mark.timeout(60)
def test_yaml_save_and_load_round_trip_through_the_form_and_its_buttons(tmp_path):
    form = ConfigForm()
    form.widget_for("train.lr").value = "3e-4"
    form.widget_for("dist.procs_per_node").value = "4"
    form.widget_for("launch.slurm.sbatch_options").value = "{reservation: xyz}"
    path = tmp_path / "job.yaml"
    form.save_yaml(path)
    assert JobConfig.from_yaml(path) == form.config

    other = ConfigForm()
    other.load_yaml(path)
    assert other.config == form.config and other.widget_for("train.lr").value == "0.0003"

    third = ConfigForm()
    third.path_text.value = str(path)
    third.load_button.click()
    assert third.config == form.config and "loaded" in third.file_status.value
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  micro_batch_sise: 3\n")
    third.path_text.value = str(bad)
    third.load_button.click()  # shown, not raised
    assert "micro_batch_size" in third.problems_html.value and "problems" in third.file_status.value
    third.path_text.value = str(tmp_path / "saved.yaml")
    third.save_button.click()
    assert JobConfig.from_yaml(tmp_path / "saved.yaml") == form.config



# --- ScalingView -----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_scaling_table_follows_the_form_and_highlights_the_config_world_size():
    form = ConfigForm()
    view = ScalingView(form)
    assert view.frame.loc[view.frame["selected"], "world_size"].tolist() == [2]
    before = view.frame.copy()
    form.widget_for("dist.procs_per_node").value = "4"
    assert view.frame.loc[view.frame["selected"], "world_size"].tolist() == [4]
    assert not view.frame.equals(before)
    selected_row = view.table.value.split('class="wb-selected"')[1].split("</tr>")[0]
    assert ">4</td>" in selected_row.split("<td")[1] + "</td>"
    form.widget_for("train.micro_batch_size").value = "8"
    assert view.frame["effective_batch"].tolist() == [8, 16, 32, 64]

    view.world_sizes.value = "1, 3"
    assert view.frame["world_size"].tolist() == [1, 3, 4]  # the config's own size is always there
    view.rule.value = "compare"
    assert set(view.frame["rule"]) == {"none", "linear", "sqrt", "capped"} and len(view.frame) == 12
    view.rule.value = "sqrt"
    assert set(view.frame["rule"]) == {"sqrt"}
    view.world_sizes.value = "1,two"
    assert "whole numbers" in view.note.value and len(view.frame) == 3  # last good table stays



@pytest.mark.timeout(60)
def test_measured_throughput_is_merged_by_world_size():
    view = ScalingView(ConfigForm())
    assert "measured_samples_per_s" not in view.frame
    view.set_measured(pd.DataFrame({"world_size": [1, 2, 4], "samples_per_s": [100.0, 190.0, 350.0],
                                    "efficiency": [1.0, 0.95, 0.875]}))
    frame = view.frame.set_index("world_size")
    assert frame.loc[2, "measured_samples_per_s"] == 190.0 and frame.loc[4, "measured_efficiency"] == 0.875
    assert pd.isna(frame.loc[8, "measured_samples_per_s"])
    assert "measured_samples_per_s" in view.table.value and "95%" in view.table.value



# --- DashboardState (no processes) -----------------------------------------------------------------
@pytest.mark.timeout(60)
def test_dashboard_state_progress_eta_and_badges_from_plain_data():
    ranks = [RankStatus(0, "running", 10, 1.0), RankStatus(1, "running", 9, 45.0, silent=True)]
    state = dashboard_state(RunStatus("running", ranks, 9, 50, steps_per_s=2.0), job_done=False)
    assert state.step == 9 and state.progress == pytest.approx(9 / 50)
    assert state.steps_per_s == pytest.approx(2.0) and state.eta_s == pytest.approx(20.5)
    assert [(b.state, b.silent, b.step) for b in state.badges] == [("running", False, 10), ("running", True, 9)]
    assert not state.done and state.failure == "" and format_eta(state.eta_s) == "ETA 0:00:20"
    finished = dashboard_state(RunStatus("finished", ranks, 9, 10), job_done=True)
    assert finished.done and finished.progress == 1.0 and finished.eta_s == 0.0



@pytest.mark.timeout(60)
def test_live_figure_redraws_only_the_data_while_it_fits_and_keeps_a_users_zoom():
    from workbench.results.plots import PlotOptions
    from workbench.ui.render import LiveFigure

    def frame(steps: int, spike: float = 0.0) -> pd.DataFrame:
        return pd.DataFrame([{"rank": r, "step": s, "loss": 1.0 / s + spike * (s == steps), "loss_reduced": 1.0 / s,
                              "lr": 1e-3, "step_time_s": 0.1, "samples_per_s": 320.0, "mem_mb": 100.0 + r}
                             for s in range(1, steps + 1) for r in (0, 1)])

    live, opts = LiveFigure(), PlotOptions()
    assert live.update(frame(50), None, opts) == "full" and live.full_draws == 1
    assert live.update(frame(55), None, opts) == "lines" and (live.full_draws, live.line_draws) == (1, 1)
    assert live.update(frame(56, spike=5.0), None, opts) == "full"  # outside the y limits: axes redrawn
    loss_ax = live.fig.axes[0]
    loss_ax.set_xlim(10, 20)  # what the toolbar's zoom does (x is linked: every panel follows)
    assert live.update(frame(200, spike=9.0), None, opts) in ("lines", "full")
    assert loss_ax.get_xlim() == (10, 20) and live.zoomed()[0]
    assert live.update(frame(200), None, PlotOptions(log_y=False)) == "full"  # new options
    assert loss_ax is not live.fig.axes[0] and live.fig.axes[0].get_yscale() == "linear"
    assert live.png().startswith(PNG_MAGIC)



@pytest.mark.timeout(60)
def test_workbench_shows_submit_problems_in_the_form_instead_of_raising(tmp_path):
    app = Workbench(tiny_cfg(tmp_path))
    app.executor.value = "slurm"
    assert app.form.widget_for("launch.executor").value == "slurm"
    app.executor.value = "local"
    app.form.widget_for("train.micro_batch_size").value = "0"
    assert app.submit() is None and app.run is None and app.run_box.children == ()
    assert "train.micro_batch_size: must be a positive whole number" in app.form.problems_html.value
    assert "not submitted" in app.status.value









def test_workbench_takes_a_task_or_a_function_not_both(tmp_path):
    with pytest.raises(ConfigError, match="give task= .* or fn= .*, not both"):
        Workbench(tiny_cfg(tmp_path), task=fn_for_the_widget, fn=fn_for_the_widget)

