"""Run history and comparison over run folders written as the ranks write them (no processes)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import workbench
from tests.support import REPO
from tests.support.runs import write_run
from workbench.config import JobConfig
from workbench.launch import history
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.writer import JsonlWriter

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
    assert row["lr_from"] == "scaled" and row["base_lr"] == pytest.approx(1e-3) and row["scaled_lr"] == row["lr"]
    assert row["steps"] == 40 and row["last_loss"] == pytest.approx(2.0 / 80 + 0.1)
    assert row["best_loss"] == pytest.approx(row["last_loss"]) and row["val_loss"] == pytest.approx(1 / 80)
    assert row["val_accuracy"] == pytest.approx(0.9) and row["duration_s"] == pytest.approx(39)
    assert str(table["start"].dtype).startswith("datetime64") and str(table["end"].dtype).startswith("datetime64")
    assert row["loss_metric"] == "loss"
    monkeypatch.setenv("WORKBENCH_RUN_ROOT", str(tmp_path))
    assert workbench.runs()["folder"].tolist() == [str(one), str(two)]
    assert workbench.runs(tmp_path / "empty").empty



def test_compare_overlays_loss_and_val_metrics_by_samples_with_a_config_diff(tmp_path):
    one = write_run(tmp_path, "one-rank", 1, "none")
    two = write_run(tmp_path, "two-ranks", 2, "linear")
    diff = workbench.config_diff([one, two])
    assert set(diff.index) == {"scaling.rule", "dist.procs_per_node", "world_size", "lr_used"}
    assert diff.loc["scaling.rule"].tolist() == ["none", "linear"]
    assert diff.loc["lr_used"].tolist() == workbench.runs(tmp_path)["lr"].tolist() == [1e-3, 2e-3]  # as runs() says
    fig = workbench.compare([one, two], x="samples")
    loss_ax = fig.axes[0]
    labelled = [line for line in loss_ax.lines if not line.get_label().startswith("_")]
    assert [line.get_label() for line in labelled] == ["one-rank", "two-ranks"]
    assert labelled[0].get_xdata().max() == 40 * 8 and labelled[1].get_xdata().max() == 40 * 16  # samples seen
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[:3] == ["training loss (reduced) · loss", "val_accuracy", "val_loss"]
    assert titles[-1] == "config fields that differ"
    shown = [cell.get_text().get_text() for cell in fig.axes[-1].tables[0].get_celld().values()]
    assert "lr used (scaled)" in shown and "world_size" in shown
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



def _own_code_run(root, name: str, logged: dict, kind: str = "function", world: int = 2):
    """A submit_fn (or script) run folder: the config's lr and batch are defaults the code never used."""
    cfg = JobConfig.from_dict({"task": {"name": f"<{kind} train>"}, "dist": {"procs_per_node": world},
                               "launch": {"run_root": str(root)}})
    run = RunDir(root / name).prepare(cfg, "local", **{kind: "notebook.train"})
    for rank in range(world):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, 11):
            writer.write({"rank": rank, "step": step, "time": 1e9 + step,
                          **{k: (v(step) if callable(v) else v) for k, v in logged.items()}})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": 10, "time": 1e9 + 11})
    write_json_atomic(run.summary, {"status": "finished", "steps": 10})
    return run.root


def test_compare_draws_the_loss_each_run_logged_and_the_eval_metrics_asked_for(tmp_path):
    """A function run logs train_loss (and, as Lightning does, val_loss in its records), a config run
    logs loss and eval events: each run's own loss is drawn, named as the dashboard names its panel."""
    fn = _own_code_run(tmp_path, "fn-run", {"train_loss": lambda s: 1.0 / s, "val_loss": lambda s: 3.0 / s})
    cfg_run = write_run(tmp_path, "cfg-run", 2, "linear")
    fig = workbench.compare([fn, cfg_run], x="step")
    loss_ax = fig.axes[0]
    assert loss_ax.get_title(loc="left") == "training loss (reduced) · train_loss, loss"
    labelled = [line for line in loss_ax.lines if not line.get_label().startswith("_")]
    assert [line.get_label() for line in labelled] == ["fn-run (train_loss)", "cfg-run (loss)"]
    assert labelled[0].full_raw.tolist() == pytest.approx([1.0 / s for s in range(1, 11)])  # the mean over ranks
    assert labelled[1].full_x.max() == 40
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[1:4] == ["val_accuracy", "val_loss", "config fields that differ"]
    (val_line,) = [line for line in fig.axes[2].lines if line.get_label() == "fn-run"]  # from its records
    assert val_line.get_ydata().tolist() == pytest.approx([3.0 / s for s in range(1, 11)])
    asked = workbench.compare([fn, cfg_run], metrics=["val_loss"])
    assert [ax.get_title(loc="left") for ax in asked.axes][1:] == ["val_loss", "config fields that differ"]
    with pytest.raises(ValueError, match="metrics: 'val_acc' was logged by none of the runs; they logged "
                                         "val_accuracy, val_loss"):
        workbench.compare([fn, cfg_run], metrics=["val_acc"])
    with pytest.raises(ValueError, match=r"metrics: give a list of eval metric names, e.g. \['val_loss'\]"):
        workbench.compare([fn, cfg_run], metrics="val_loss")


def test_one_rule_names_the_loss_for_the_panels_runs_and_compare():
    from workbench.results.panels import loss_column
    from workbench.results.series import MetricData

    for columns, expected in ((["rank", "step", "lr", "train_loss"], "train_loss"),
                              (["rank", "step", "loss", "train_loss"], "loss"),
                              (["rank", "step", "val_loss", "recon_loss"], "recon_loss"),
                              (["rank", "step", "val_loss", "loss_reduced"], None)):
        frame = pd.DataFrame({c: [0, 1] if c in ("rank", "step") else [0.5, 0.25] for c in columns})
        assert history.loss_metric(frame) == expected == loss_column(MetricData.from_frame(frame)), columns
    empty = pd.DataFrame({"rank": [0], "step": [1], "loss": [np.nan], "train_loss": [0.3]})
    assert history.loss_metric(empty) == "train_loss"  # a name with no value is passed over


def test_a_function_run_shows_the_lr_it_logged_and_no_config_defaults(tmp_path):
    _own_code_run(tmp_path, "logs-lr", {"train_loss": lambda s: 1.0 / s, "lr": lambda s: 0.02 * min(1, s / 5)})
    _own_code_run(tmp_path, "logs-no-lr", {"train_loss": lambda s: 2.0 / s}, kind="script")
    table = workbench.runs(tmp_path).set_index("name")
    logged, silent = table.loc["logs-lr"], table.loc["logs-no-lr"]
    assert logged["lr"] == pytest.approx(0.02) and logged["lr_from"] == "logged"  # its peak, not the default 0.002
    assert pd.isna(logged["base_lr"]) and pd.isna(logged["scaled_lr"]) and pd.isna(logged["rule"])
    assert pd.isna(logged["effective_batch"])  # its batches are its own: no config default of 64
    assert pd.isna(silent["lr"]) and pd.isna(silent["lr_from"]) and pd.isna(silent["effective_batch"])
    assert logged["loss_metric"] == "train_loss" and logged["last_loss"] == pytest.approx(0.1)
    assert silent["best_loss"] == pytest.approx(0.2)


def test_whole_numbers_are_integers_and_times_datetimes_even_beside_an_unreadable_folder(tmp_path):
    write_run(tmp_path, "good", 2, "linear")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("[]")
    table = workbench.runs(tmp_path)
    for column in history.WHOLE:
        assert str(table[column].dtype) == "Int64", column
    row = table.set_index("name").loc["good"]
    assert row["steps"] == 40 and isinstance(row["steps"], (int, np.integer)) and not isinstance(row["steps"], float)
    assert isinstance(row["start"], pd.Timestamp) and isinstance(row["end"], pd.Timestamp)
    assert row["end"] - row["start"] == pd.Timedelta(seconds=row["duration_s"])


def test_runs_folders_are_absolute_and_equal_run_folder_with_a_relative_root(tmp_path, monkeypatch):
    from workbench.launch.run import Run

    monkeypatch.chdir(tmp_path)
    made = write_run(Path("runs"), "one", 1, "none")
    table = workbench.runs("runs")
    (folder,) = table["folder"].tolist()
    assert Path(folder).is_absolute() and folder == str((tmp_path / made).resolve())
    assert folder == str(Run.load(folder).folder)
    monkeypatch.setenv("WORKBENCH_RUN_ROOT", "runs")
    assert workbench.runs()["folder"].tolist() == [folder]


def test_a_logged_lr_beats_the_config_and_a_finished_run_is_read_once(tmp_path, monkeypatch):
    folder = write_run(tmp_path, "warmup", 2, "linear")
    writer = JsonlWriter(RunDir(folder).metrics(0))
    writer.write({"rank": 0, "step": 40, "lr": 0.0015})  # merged into step 40's row
    writer.close()
    row = workbench.runs(tmp_path).iloc[0]
    assert row["lr"] == pytest.approx(0.0015) and row["lr_from"] == "logged" and row["scaled_lr"] == pytest.approx(2e-3)
    monkeypatch.setattr(history, "run_row", lambda folder, loaded=None: pytest.fail("read again"))
    assert workbench.runs(tmp_path).iloc[0]["lr"] == pytest.approx(0.0015)  # from memory: nothing changed
    writer = JsonlWriter(RunDir(folder).metrics(1))
    writer.write({"rank": 1, "step": 40, "lr": 0.0016})
    writer.close()
    with pytest.raises(pytest.fail.Exception, match="read again"):  # a file changed: read again
        workbench.runs(tmp_path)


def _forget_rows_in_memory(monkeypatch):
    """A fresh process: no row kept in memory (what is on disk stays)."""
    monkeypatch.setattr(history, "_ROWS", {})


def test_an_ended_runs_row_is_kept_in_its_folder_and_read_from_there_by_a_fresh_process(tmp_path, monkeypatch):
    folder = write_run(tmp_path, "ended", 2, "linear")
    first = workbench.runs(tmp_path)
    kept = RunDir(folder).row_cache
    assert kept.exists() and (kept.stat().st_mode & 0o777) == 0o600
    _forget_rows_in_memory(monkeypatch)
    monkeypatch.setattr(history, "run_row", lambda folder, loaded=None: pytest.fail("read again"))
    again = workbench.runs(tmp_path)
    pd.testing.assert_frame_equal(first, again)
    assert again.iloc[0]["val_loss"] == pytest.approx(1 / 80) and again.iloc[0]["steps"] == 40


def test_a_running_run_is_read_live_and_keeps_no_row(tmp_path):
    from tests.support.runs import run_folder

    run = run_folder(tmp_path, steps=50)  # its job is this process: alive
    assert workbench.runs(tmp_path).iloc[0][["status", "steps"]].tolist() == ["running", 50]
    assert not run.row_cache.exists()


def test_a_run_resumed_after_its_row_was_kept_shows_its_new_values(tmp_path, monkeypatch):
    folder = write_run(tmp_path, "resumed", 2, "linear")
    assert workbench.runs(tmp_path).iloc[0]["steps"] == 40  # ended: its row is kept
    run = RunDir(folder)
    run.prepare(JobConfig.from_yaml(run.config), "local")  # a resume in the same folder, as Run.resume does
    for rank in range(2):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(41, 61):
            writer.write({"rank": rank, "step": step, "time": 1e9 + step, "loss": 0.05, "loss_reduced": 0.05})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": 60, "time": 2e9})
    write_json_atomic(run.summary, {"status": "finished"})
    for fresh in (False, True):  # this process, which kept the row in memory, and a fresh one
        if fresh:
            _forget_rows_in_memory(monkeypatch)
        row = workbench.runs(tmp_path).iloc[0]
        assert row["steps"] == 60 and row["last_loss"] == pytest.approx(0.05) and row["status"] == "finished"


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"version": 1, "row": 3, "signature": []}',
                                     b'{"version": "1", "row": {}, "signature": []}'])
def test_a_damaged_row_file_is_warned_about_and_written_again(tmp_path, monkeypatch, content):
    folder = write_run(tmp_path, "damaged", 2, "linear")
    expected = workbench.runs(tmp_path)
    RunDir(folder).row_cache.write_bytes(content)
    _forget_rows_in_memory(monkeypatch)
    with pytest.warns(workbench.DamagedFileWarning, match=r"row\.json: .*; read as if it were absent"):
        found = workbench.runs(tmp_path)
    pd.testing.assert_frame_equal(found, expected)
    _forget_rows_in_memory(monkeypatch)
    monkeypatch.setattr(history, "run_row", lambda folder, loaded=None: pytest.fail("read again"))
    pd.testing.assert_frame_equal(workbench.runs(tmp_path), expected)  # rewritten: read from the file


def test_a_row_file_of_another_version_or_for_other_files_is_not_used(tmp_path, monkeypatch):
    import json

    folder = write_run(tmp_path, "other", 2, "linear")
    workbench.runs(tmp_path)
    kept = RunDir(folder).row_cache
    stored = json.loads(kept.read_text())
    for change in ({"version": 2}, {"signature": stored["signature"][1:]}):
        kept.write_text(json.dumps({**stored, **change, "row": {**stored["row"], "steps": 7}}))
        _forget_rows_in_memory(monkeypatch)
        assert workbench.runs(tmp_path).iloc[0]["steps"] == 40  # read afresh, not the 7 in the file


def test_workbench_runs_lists_the_runs_with_each_lr_labelled(tmp_path, capsys):
    from tests.support.runs import write_run
    from workbench.cli import main

    write_run(tmp_path, "alpha", 2, "linear")
    write_run(tmp_path, "beta", 1, "sqrt")
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["name", "status"] and "base_lr" in out[0] and "lr_used" in out[0]
    assert [line.split()[0] for line in out[1:3]] == ["alpha", "beta"]
    assert out[-1].startswith("[workbench] 2 run(s); lr_used: the peak the job logged, or train.lr scaled")
    assert main(["runs", str(tmp_path), "--last", "1"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]] == ["beta"]
    assert main(["runs", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"runs: {tmp_path / 'nope'} is not a folder; give a run root" in err, err


def test_a_first_listing_reads_many_folders_metrics_together_and_a_damaged_file_still_reads_by_the_line_rule(
        tmp_path, monkeypatch):
    """workbench.runs() over many never-listed folders reads their small metrics files in a few
    columnar calls (reader.read_cold, issue 30 item 9); a file the columnar reader will not vouch for
    (a damaged line, a text field, NaN) leaves its group to the halves and the line rule, so every row
    is the row the folder gives alone, and the damaged line is named; a FIFO in a metrics file's
    place is not waited on."""
    from workbench.runfolder import fastjson

    folders = [write_run(tmp_path, f"run{i:02d}", 1 + i % 2, "linear", steps=10)
               for i in range(history.READ_TOGETHER_MIN + 2)]
    odd = [b'{"rank": 0, "step": "x"}\n', b'{"rank": 0, "step": 11, "note": "hi"}\n',
           b'{"rank": 0, "step": 11, "loss": NaN, "loss_reduced": 0.5}\n']
    for folder, line in zip(folders[3:6], odd):
        with open(RunDir(folder).metrics(0), "ab") as fh:
            fh.write(line)
    fifo = RunDir(folders[7]).metrics(1)
    fifo.unlink()
    os.mkfifo(fifo)  # not waited on: unreadable, said once
    taken: list[int] = []
    read_blocks = fastjson.read_blocks

    def counted(blocks: list[bytes], *args: object) -> object:
        found = read_blocks(blocks, *args)
        taken.append(len(found) if found is not None else 0)
        return found

    monkeypatch.setattr(fastjson, "read_blocks", counted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        together = history.cached_rows(folders)
    said = [str(w.message) for w in caught if w.category is workbench.DamagedFileWarning]
    assert any("run03/metrics/rank0.jsonl: skipped line 11 " in text for text in said), said
    assert any("run07/metrics/rank1.jsonl: unreadable: a FIFO" in text for text in said), said
    files = sum(1 + i % 2 for i in range(len(folders))) - 1
    assert files - 3 - 2 * 3 <= sum(taken) < files and max(taken) >= 8, taken  # but the odd files (and a few beside)
    monkeypatch.setattr(fastjson, "read_blocks", read_blocks)
    with pytest.warns(workbench.DamagedFileWarning, match=r"run03/metrics/rank0\.jsonl: skipped line 11 "):
        alone = [history.run_row(folder) for folder in folders]  # each folder by its own polls
    assert together == alone
    assert together[5]["last_loss"] == pytest.approx(0.5) and together[4]["steps"] == 11
