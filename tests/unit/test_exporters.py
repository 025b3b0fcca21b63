"""Exporters: a run's metrics into TensorBoard (read back with TensorBoard's own reader), CSV and
Parquet; live mirrors from the ranks to TensorBoard, W&B (offline) and MLflow (a file store), and a
failing mirror that becomes a warning instead of breaking training."""
from __future__ import annotations

import pandas as pd
import pytest

from tests.support.runs import tensorboard_scalars, write_run
from workbench.launch.run import Run


@pytest.mark.timeout(120)
def test_to_tensorboard_writes_per_rank_scalars_that_tensorboard_reads_back(tmp_path):
    run = Run.load(write_run(tmp_path, "two-ranks", 2, "linear"))
    logdir = run.to_tensorboard(tmp_path / "tb")
    frame = run.metrics()
    for rank in (0, 1):
        found = tensorboard_scalars(logdir / f"rank{rank}")
        expected = frame[frame["rank"] == rank]
        assert [step for step, _ in found["loss"]] == expected["step"].tolist()
        assert [v for _, v in found["loss"]] == pytest.approx(expected["loss"].tolist(), rel=1e-6)
    assert tensorboard_scalars(logdir / "rank0")["val_loss"] == [(20, pytest.approx(1 / 40)), (40, pytest.approx(1 / 80))]



@pytest.mark.timeout(120)
def test_each_rank_s_eval_events_go_to_that_rank_s_tensorboard_folder_once(tmp_path):
    """Every rank records an eval event with the same all-reduced results (engine.trainer.evaluate), as
    its live mirror logs them into its own folder: the export writes each rank's own events to that
    rank, once per eval step, not all of them into rank 0 (twice at each step) and none into rank 1."""
    import time

    from workbench.runfolder.layout import RunDir
    from workbench.runfolder.writer import JsonlWriter

    folder = write_run(tmp_path, "two-ranks", 2, "linear")
    events = JsonlWriter(RunDir(folder).events(1))
    for step in (20, 40):
        events.write({"event": "eval", "rank": 1, "step": step, "time": time.time() - 100 + step,
                      "val_loss": 1.0 / (step * 2), "val_accuracy": 0.5 + step / 100})
    events.close()
    logdir = Run.load(folder).to_tensorboard(tmp_path / "tb")
    for rank in (0, 1):
        found = tensorboard_scalars(logdir / f"rank{rank}")
        assert found["val_loss"] == [(20, pytest.approx(1 / 40)), (40, pytest.approx(1 / 80))], rank
        assert [step for step, _ in found["val_accuracy"]] == [20, 40], rank
        assert len(found["loss"]) == 40



@pytest.mark.timeout(120)
def test_workbench_export_run_dir_to_tensorboard_and_tables(tmp_path, capsys):
    from workbench.cli import main

    folder = write_run(tmp_path, "one-rank", 1, "none")
    assert main(["export", str(folder), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "tensorboard --logdir" in capsys.readouterr().out
    assert len(tensorboard_scalars(tmp_path / "tb" / "rank0")["loss"]) == 40
    assert main(["export", str(folder), "--metrics", str(tmp_path / "m.parquet")]) == 0
    table = pd.read_parquet(tmp_path / "m.parquet")
    assert len(table) == 40 and {"wall_time", "elapsed_s", "samples", "loss"} <= set(table.columns)
    csv = Run.load(folder).export_metrics()
    assert csv == folder / "exports" / "metrics.csv" and len(pd.read_csv(csv)) == 40
    with pytest.raises(ValueError, match="format: 'xlsx' is not one of csv, parquet"):
        Run.load(folder).export_metrics(tmp_path / "m.xlsx")



@pytest.mark.timeout(120)
def test_dashboard_downloads_metrics_as_csv_and_parquet(tmp_path, monkeypatch):
    import json
    import os

    from workbench.ui import Dashboard

    folder = write_run(tmp_path, "two-ranks", 2, "linear")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))  # the Jupyter server serving tmp_path
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "jpserver-1.json").write_text(json.dumps(
        {"root_dir": str(tmp_path), "base_url": "/", "pid": os.getppid()}))
    dash = Dashboard(Run.load(folder), autostart=False)
    dash.downloads["csv"].click()
    link = dash.download_link.value
    assert "download metrics.csv" in link and str(folder / "exports" / "metrics.csv") in link
    assert "href='/files/two-ranks/exports/metrics.csv'" in link and "base64" not in link  # served, not carried
    assert len(pd.read_csv(folder / "exports" / "metrics.csv")) == 80
    dash.downloads["parquet"].click()
    assert "download metrics.parquet" in dash.download_link.value
    assert len(pd.read_parquet(folder / "exports" / "metrics.parquet")) == 80

