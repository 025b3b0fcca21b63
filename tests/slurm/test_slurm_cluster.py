"""The SLURM test cluster works end to end with submitit: results, 2-node DDP, cancellation seen by sacct."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import cloudpickle
import pytest
import submitit

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

# Jobs unpickle these functions by value, so they need not import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _executor(folder: Path, cluster, **params) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(slurm_partition=cluster.partition, cpus_per_task=1, timeout_min=5, **params)
    return executor


def _answer() -> int:
    return 42


def _all_reduce_ones() -> tuple[int, int, float, str]:
    import os

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    env = submitit.helpers.TorchDistributedEnvironment().export()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        return env.rank, env.world_size, tensor.item(), os.environ["SLURMD_NODENAME"]
    finally:
        dist.destroy_process_group()


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


def test_trivial_job_returns_its_result(slurm_cluster, tmp_path):
    job = _executor(tmp_path, slurm_cluster).submit(_answer)
    assert job.result() == 42


def test_two_nodes_all_reduce_over_gloo(slurm_cluster, tmp_path):
    job = _executor(tmp_path, slurm_cluster, nodes=2, tasks_per_node=1).submit(_all_reduce_ones)
    results = job.results()
    assert sorted(rank for rank, *_ in results) == [0, 1]
    assert all(world_size == 2 and total == 2.0 for _, world_size, total, _ in results)
    assert {node for *_, node in results} == set(slurm_cluster.nodes)


def test_cancelled_job_is_reported_cancelled_by_sacct(slurm_cluster, tmp_path):
    job = _executor(tmp_path, slurm_cluster).submit(_sleep, 600)
    deadline = time.monotonic() + 60
    while job.get_info(mode="force").get("State") != "RUNNING":
        assert time.monotonic() < deadline, f"job never started: {job.get_info(mode='force')}"
        time.sleep(0.5)
    job.cancel()
    # sacct reports the end state (without accounting it never would, and job.result() would hang)
    while not job.get_info(mode="force").get("State", "").startswith("CANCELLED"):
        assert time.monotonic() < deadline + 90, f"sacct never said CANCELLED: {job.get_info(mode='force')}"
        time.sleep(0.5)
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.result()  # done without a result: submitit gives up after its wait for the result file
