"""The CUDA and NCCL paths, run where a GPU exists (`python -m pytest -m gpu`), skipped cleanly
without one: a GPU per rank from the user's visible set, NCCL process groups, bf16 autocast, fp16
with a GradScaler, CUDA memory figures, the health checks' collectives on NCCL, failure on NCCL."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

import workbench
from tests.support.tasks_for_tests import failing_at
from workbench.config import JobConfig

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (none visible)")]


def _cfg(tmp_path: Path, **train) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 4096, "n_val": 512, "hidden": 256}},
        "train": {"micro_batch_size": 64, "max_steps": 60, "checkpoint_every_steps": 30, "eval_every_steps": 30,
                  "lr": 3e-3, **train},
        "dist": {"procs_per_node": min(2, GPUS), "check_every_steps": 10, "timeout_s": 120},
        "launch": {"run_root": str(tmp_path / "runs"), "time_limit": "10"},
    })


def _finished(run: workbench.Run) -> workbench.Run:
    status = run.wait(timeout=240)
    assert status.state == "finished", (run.exception(), run.logs(0))
    return run


def test_each_rank_trains_on_its_own_gpu_over_nccl(tmp_path):
    run = _finished(workbench.submit(_cfg(tmp_path)))
    events = run.events()
    starts = events[events["event"] == "start"].sort_values("rank")
    assert set(starts["device"]) == {"cuda:0"} and set(starts["backend"]) == {"nccl"}
    visible = starts["cuda_visible_devices"].tolist()
    assert len(set(visible)) == len(visible) == min(2, GPUS)  # one distinct GPU per rank
    frame = run.metrics()
    assert (frame.groupby("rank")["step"].max() == 60).all()
    assert (frame["mem_mb"] > 0).all()  # CUDA peak allocated memory, per rank
    first, last = frame.groupby("step")["loss_reduced"].first().iloc[[0, -1]]
    assert last < first


def test_health_checks_and_shard_check_run_over_nccl(tmp_path):
    run = _finished(workbench.submit(_cfg(tmp_path)))
    health = run.health()
    assert health["in_sync"] is True and health["shards_ok"] is True
    events = run.events()
    assert (events["event"] == "sync_check").sum() == 6


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    run = _finished(workbench.submit(_cfg(tmp_path, precision=precision)))
    frame = run.metrics()
    assert frame["loss"].map(math.isfinite).all()
    first, last = frame.groupby("step")["loss_reduced"].first().iloc[[0, -1]]
    assert last < first
    if precision == "fp16":  # the GradScaler's state is checkpointed with the model
        state = torch.load(sorted((run.folder / "checkpoints").glob("step-*.pt"))[-1], weights_only=False)
        assert state["scaler"]["scale"] > 0


def test_a_failing_rank_on_nccl_stops_the_others(tmp_path):
    if GPUS < 2:
        pytest.skip("needs two GPUs for two ranks")
    cfg = _cfg(tmp_path, max_steps=100000, checkpoint_every_steps=None, eval_every_steps=None)
    run = workbench.submit(cfg, task=functools.partial(failing_at, 20, n_train=4096, n_val=512, hidden=256))
    status = run.wait(timeout=200)  # inside dist.timeout_s (600 s): rank 0 did not wait out the NCCL collective
    assert status.state == "failed"
    assert [r.state for r in status.ranks] == ["aborted", "failed"], "rank 0 was stopped, not timed out"
    failure = run.exception()
    assert failure.rank == 1 and "injected failure on rank 1" in failure.traceback


def test_a_warm_pool_runs_jobs_on_nccl_and_leaves_nothing(tmp_path):
    """workbench.Pool on GPUs: the warm workers bring NCCL up once, run two jobs (each its own run
    folder, each trained on the ranks' GPUs), and nothing of the pool survives close()."""
    from tests.support.lifecycle import assert_nothing_left

    cfg = _cfg(tmp_path)
    with workbench.Pool(cfg, idle_timeout_s=600) as pool:
        pool.wait_ready(240)
        assert pool._resolved_backend() == "nccl"  # what "auto" chose on a GPU
        for lr in (3e-3, 1e-3):
            run = _finished(pool.submit(cfg.replace(train__lr=lr)))
            starts = run.events()
            assert set(starts[starts["event"] == "start"]["device"]) == {"cuda:0"}
            assert (run.metrics().groupby("rank")["step"].max() == 60).all()
    assert_nothing_left(pool.dir.root)
