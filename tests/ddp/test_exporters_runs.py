"""Exporters: a run's metrics into TensorBoard (read back with TensorBoard's own reader), CSV and
Parquet; live mirrors from the ranks to TensorBoard, W&B (offline) and MLflow (a file store), and a
failing mirror that becomes a warning instead of breaking training."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import workbench
from tests.support.runs import tensorboard_scalars
from workbench.config import JobConfig


def _is_rank_of(pid: str, folder: Path) -> bool:
    try:
        return str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False



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
        found = tensorboard_scalars(run.dir.tensorboard(rank))
        assert [step for step, _ in found["loss"]] == list(range(1, 9))
    assert [step for step, _ in tensorboard_scalars(run.dir.tensorboard(0))["val_loss"]] == [4, 8]
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
    run = workbench.submit(cfg)
    assert run.wait(timeout=240).state == "finished", run.exception()
    warnings = run.health()["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("rank 0: log.mlflow: could not start")
    assert "training goes on without it" in warnings[0]
    assert run.metrics()["step"].max() == 8
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_rank_of(p, run.folder)]

