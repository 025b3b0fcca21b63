"""A sweep on the real SLURM test cluster: each trial is a SLURM job (2 nodes x 1 rank), `parallel`
of them in the queue at once, the study in this process; every trial finishes on the cluster's
nodes and no job is left in the queue.  (One job per trial, not a job array: see the sweep module.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import workbench
from workbench.config import JobConfig

optuna = pytest.importorskip("optuna")
pytestmark = [pytest.mark.slurm]


def _cfg(tmp_path: Path, cluster) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 1024, "n_val": 128}},
        "train": {"micro_batch_size": 16, "max_steps": 8, "eval_every_steps": 4, "checkpoint_every_steps": None},
        "dist": {"nodes": 2, "procs_per_node": 1, "timeout_s": 60, "threads_per_rank": 1},
        "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"), "time_limit": "10",
                   "slurm": {"partition": cluster.partition, "cpus_per_task": 1}},
    })


def _queued(job_ids: list[str]) -> str:
    out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-t", "PD,R,CF,CG", "-o", "%i %T"],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


@pytest.mark.timeout(600)
def test_a_sweep_runs_its_trials_as_slurm_jobs(slurm_cluster, tmp_path):
    sweep = workbench.sweep(_cfg(tmp_path, slurm_cluster), {"train.lr": [1e-3, 1e-2]}, parallel=2, pruner="none")
    sweep.wait(timeout=480)
    frame = sweep.frame()
    assert len(frame) == 2 and set(frame["state"]) == {"finished"}, frame
    job_ids = []
    for run in sweep.runs:
        assert run.meta["executor"] == "slurm" and {r.host for r in run.status().ranks} == {"n1", "n2"}
        job_ids.append(str(run.meta["job_id"]))
    assert len(set(job_ids)) == 2
    assert not _queued(job_ids)
