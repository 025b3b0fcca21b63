"""A warm pool on the real SLURM test cluster: one allocation of 2 nodes x 1 rank runs an engine
job, a function and a %%ranks cell, then closes and the allocation is released; the idle timeout
releases it too."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import workbench
from tests.support.lifecycle import run_processes, wait_until
from workbench.config import JobConfig
from workbench.runfolder.layout import read_json

pytestmark = [pytest.mark.slurm]


def _cfg(tmp_path: Path, cluster) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 1024, "n_val": 128}},
        "train": {"micro_batch_size": 16, "max_steps": 10},
        "dist": {"nodes": 2, "procs_per_node": 1, "timeout_s": 60, "threads_per_rank": 1},
        "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"), "time_limit": "10",
                   "slurm": {"partition": cluster.partition, "cpus_per_task": 1}},
    })


def _allocated(job_id: str) -> bool:
    """squeue still lists the job as pending, running or completing (finished jobs stay listed a while)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "PD,R,CF,CG", "-o", "%T"], capture_output=True,
                         text=True, timeout=30)
    return bool(out.stdout.strip())


def _hosts(run) -> set[str]:
    return {r.host for r in run.status().ranks}


def _sum_of_ranks():
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return value.item()


@pytest.mark.timeout(400)
def test_a_slurm_pool_runs_jobs_and_releases_its_allocation(slurm_cluster, tmp_path):
    cfg = _cfg(tmp_path, slurm_cluster)
    with workbench.Pool(cfg) as pool:
        pool.wait_ready(240)
        job_id = str(read_json(pool.dir.meta)["job_id"])
        assert _allocated(job_id)
        run = pool.submit(cfg.replace(train__lr=0.2))
        assert run.wait(timeout=120).state == "finished", run.exception()
        assert sorted(run.metrics()["rank"].unique()) == [0, 1] and _hosts(run) == {"n1", "n2"}
        summed = pool.submit_fn(_sum_of_ranks)
        assert summed.wait(timeout=120).state == "finished", summed.exception()
        assert summed.results() == [3.0, 3.0]
        cell = pool.run_cell("import socket, os\nos.environ['SLURMD_NODENAME'], rank")
        assert [o["result"] for o in cell] == ["('n1', 0)", "('n2', 1)"]
    wait_until(lambda: not _allocated(job_id), 60, "the allocation is released after close()")
    assert not run_processes(pool.dir.root)


@pytest.mark.timeout(400)
def test_an_idle_slurm_pool_releases_its_allocation(slurm_cluster, tmp_path):
    pool = workbench.Pool(_cfg(tmp_path, slurm_cluster), idle_timeout_s=3).wait_ready(240)
    job_id = str(read_json(pool.dir.meta)["job_id"])
    wait_until(lambda: not _allocated(job_id), 90, "the idle pool's allocation is released")
    assert "idle" in read_json(pool.dir.meta)["closed_by"]
    assert not run_processes(pool.dir.root)
    pool.close()
