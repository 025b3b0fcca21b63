"""Exporters: a run's metrics into TensorBoard (read back with TensorBoard's own reader), CSV and
Parquet; live mirrors from the ranks to TensorBoard, W&B (offline) and MLflow (a file store), and a
failing mirror that becomes a warning instead of breaking training."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pytest

import workbench
from tests.test_history import write_run
from workbench.config import JobConfig
from workbench.launch.run import Run


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.timeout(120)
def test_to_tensorboard_writes_per_rank_scalars_that_tensorboard_reads_back(tmp_path):
    run = Run.load(write_run(tmp_path, "two-ranks", 2, "linear"))
    logdir = run.to_tensorboard(tmp_path / "tb")
    frame = run.metrics()
    for rank in (0, 1):
        found = scalars(logdir / f"rank{rank}")
        expected = frame[frame["rank"] == rank]
        assert [step for step, _ in found["loss"]] == expected["step"].tolist()
        assert [v for _, v in found["loss"]] == pytest.approx(expected["loss"].tolist(), rel=1e-6)
    assert scalars(logdir / "rank0")["val_loss"] == [(20, pytest.approx(1 / 40)), (40, pytest.approx(1 / 80))]


@pytest.mark.timeout(120)
def test_workbench_export_run_dir_to_tensorboard_and_tables(tmp_path, capsys):
    from workbench.cli import main

    folder = write_run(tmp_path, "one-rank", 1, "none")
    assert main(["export", str(folder), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "tensorboard --logdir" in capsys.readouterr().out
    assert len(scalars(tmp_path / "tb" / "rank0")["loss"]) == 40
    assert main(["export", str(folder), "--metrics", str(tmp_path / "m.parquet")]) == 0
    table = pd.read_parquet(tmp_path / "m.parquet")
    assert len(table) == 40 and {"wall_time", "elapsed_s", "samples", "loss"} <= set(table.columns)
    csv = Run.load(folder).export_metrics()
    assert csv == folder / "exports" / "metrics.csv" and len(pd.read_csv(csv)) == 40
    with pytest.raises(ValueError, match="format: 'xlsx' is not one of csv, parquet"):
        Run.load(folder).export_metrics(tmp_path / "m.xlsx")


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_ranks_mirror_live_to_tensorboard_wandb_and_mlflow(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store for those who ask
    store = f"file:{tmp_path / 'mlruns'}"
    cfg = JobConfig.from_dict({
        "task": {"options": {"n_train": 256, "n_val": 64}},
        "train": {"micro_batch_size": 16, "max_steps": 8, "eval_every_steps": 4},
        "dist": {"procs_per_node": 2, "threads_per_rank": 1},
        "launch": {"run_root": str(tmp_path / "runs")},
        "log": {"tensorboard": True, "wandb": True, "wandb_mode": "offline", "mlflow": True,
                "mlflow_tracking_uri": store, "mlflow_experiment": "mirror-test"},
    })
    run = workbench.submit(cfg)
    assert run.wait(timeout=240).state == "finished", run.exception()
    for rank in (0, 1):
        found = scalars(run.dir.tensorboard(rank))
        assert [step for step, _ in found["loss"]] == list(range(1, 9))
    assert [step for step, _ in scalars(run.dir.tensorboard(0))["val_loss"]] == [4, 8]
    offline = list((run.folder / "wandb").rglob("*.wandb"))
    assert offline and offline[0].stat().st_size > 0
    client = MlflowClient(tracking_uri=store)
    (mirrored,) = client.search_runs([client.get_experiment_by_name("mirror-test").experiment_id])
    assert mirrored.info.run_name == run.folder.name and mirrored.data.params["train.max_steps"] == "8"
    assert [m.step for m in client.get_metric_history(mirrored.info.run_id, "loss_reduced")] == list(range(1, 9))
    assert not run.health()["warnings"]


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_failing_mirror_is_a_warning_and_training_goes_on(tmp_path):
    cfg = JobConfig.from_dict({
        "task": {"options": {"n_train": 256, "n_val": 64}},
        "train": {"micro_batch_size": 16, "max_steps": 8},
        "dist": {"procs_per_node": 2, "threads_per_rank": 1},
        "launch": {"run_root": str(tmp_path / "runs")},
        "log": {"mlflow": True, "mlflow_tracking_uri": "bogus-scheme://nowhere"},
    })
    started = time.monotonic()
    run = workbench.submit(cfg)
    assert run.wait(timeout=240).state == "finished", run.exception()
    warnings = run.health()["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("rank 0: log.mlflow: could not start")
    assert "training goes on without it" in warnings[0]
    assert run.metrics()["step"].max() == 8
    assert time.monotonic() - started < 240
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_rank_of(p, run.folder)]


def _is_rank_of(pid: str, folder: Path) -> bool:
    try:
        return str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_dashboard_downloads_metrics_as_csv_and_parquet(tmp_path):
    import base64
    import io

    from workbench.ui import Dashboard

    folder = write_run(tmp_path, "two-ranks", 2, "linear")
    dash = Dashboard(Run.load(folder), autostart=False)
    dash.downloads["csv"].click()
    link = dash.download_link.value
    assert "download metrics.csv" in link and str(folder / "exports" / "metrics.csv") in link
    data = base64.b64decode(link.split("base64,")[1].split("'")[0])
    assert len(pd.read_csv(io.BytesIO(data))) == 80
    dash.downloads["parquet"].click()
    assert "download metrics.parquet" in dash.download_link.value
    assert len(pd.read_parquet(folder / "exports" / "metrics.parquet")) == 80
