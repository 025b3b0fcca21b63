"""Run history and comparison over run folders written as the ranks write them (no processes)."""
from __future__ import annotations

import pandas as pd
import pytest

import workbench
from tests.support import REPO
from tests.support.runs import write_run

pytestmark = pytest.mark.timeout(60)









def test_runs_lists_every_run_folder_with_its_facts(tmp_path, monkeypatch):
    one = write_run(tmp_path, "one-rank", 1, "none")
    two = write_run(tmp_path, "two-ranks", 2, "linear", final="failed")
    (tmp_path / "not-a-run").mkdir()
    table = workbench.runs(tmp_path)
    assert table["name"].tolist() == ["one-rank", "two-ranks"]
    row = table.set_index("name").loc["two-ranks"]
    assert row["folder"] == str(two) and row["status"] == "failed" and row["world_size"] == 2
    assert row["effective_batch"] == 16 and row["lr"] == pytest.approx(2e-3) and row["rule"] == "linear"
    assert row["steps"] == 40 and row["last_loss"] == pytest.approx(2.0 / 80 + 0.1)
    assert row["best_loss"] == pytest.approx(row["last_loss"]) and row["val_loss"] == pytest.approx(1 / 80)
    assert row["val_accuracy"] == pytest.approx(0.9) and row["duration_s"] == pytest.approx(39)
    assert str(table["start"].dtype).startswith("datetime64")
    monkeypatch.setenv("WORKBENCH_RUN_ROOT", str(tmp_path))
    assert workbench.runs()["folder"].tolist() == [str(one), str(two)]
    assert workbench.runs(tmp_path / "empty").empty



def test_compare_overlays_loss_and_val_metrics_by_samples_with_a_config_diff(tmp_path):
    one = write_run(tmp_path, "one-rank", 1, "none")
    two = write_run(tmp_path, "two-ranks", 2, "linear")
    diff = workbench.config_diff([one, two])
    assert set(diff.index) == {"scaling.rule", "dist.procs_per_node", "world_size"}
    assert diff.loc["scaling.rule"].tolist() == ["none", "linear"]
    fig = workbench.compare([one, two], x="samples")
    loss_ax = fig.axes[0]
    labelled = [line for line in loss_ax.lines if not line.get_label().startswith("_")]
    assert [line.get_label() for line in labelled] == ["one-rank", "two-ranks"]
    assert labelled[0].get_xdata().max() == 40 * 8 and labelled[1].get_xdata().max() == 40 * 16  # samples seen
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[:3] == ["training loss (reduced)", "val_accuracy", "val_loss"]
    assert titles[-1] == "config fields that differ"
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    fig.savefig(artifacts / "compare-two-runs.png", dpi=100)



def test_an_unreadable_folder_says_why_and_does_not_hide_the_others(tmp_path):
    write_run(tmp_path, "good", 1, "none")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("{}")
    (bad / "config.yaml").write_text("train: {lr: nope}\n")
    table = workbench.runs(tmp_path)
    assert len(table) == 2 and isinstance(table, pd.DataFrame)
    assert table.set_index("name").loc["good", "status"] == "finished"



def test_runs_widget_lists_opens_and_compares(tmp_path):
    from workbench.ui import RunsView

    one = write_run(tmp_path, "one-rank", 1, "none")
    two = write_run(tmp_path, "two-ranks", 2, "linear")
    view = RunsView(tmp_path)
    assert view.table.value.count("<tr>") == 3 and "two-ranks" in view.table.value
    view.buttons["Compare"].click()
    assert "select two or more" in view.message.value
    view.select.value = (str(one), str(two))
    view.buttons["Compare"].click()
    assert "compared 2 runs" in view.message.value
    assert bytes(view.detail.children[0].value).startswith(b"\x89PNG")
    view.buttons["Open"].click()
    assert view.dashboard is not None and view.detail.children == (view.dashboard.widget,)
    assert view.dashboard.run.folder == one
    view.dashboard.stop()
    view.buttons["Cancel"].click()
    assert "no selected run is still going" in view.message.value
    view.buttons["Resume"].click()
    assert "select one run" in view.message.value

