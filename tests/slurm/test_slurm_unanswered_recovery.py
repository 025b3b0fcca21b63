"""A dashboard following a real SLURM job while SLURM stops answering and then answers again: it says
so in one line (SLURM's own words), keeps following the run folder, and clears the line by itself
once `sacct` works again.  SLURM's silence is real: this process's SLURM_CONF points the clients at a
slurm.conf whose controller and accounting ports are closed, then back at the test cluster's.

(Without a cluster, tests/process/test_slurm_unanswered.py covers the line, the CLI and Run.wait.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import workbench
from tests.support.lifecycle import ENDLESS, wait_for_step, wait_until
from tests.support.slurm_cluster import closed_port
from workbench.config import JobConfig

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]


def _down_conf(tmp_path: Path) -> str:
    port = closed_port()
    conf = tmp_path / "down.conf"
    conf.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    "AuthType=auth/munge\nMessageTimeout=2\nAccountingStorageType=accounting_storage/slurmdbd\n"
                    f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={port}\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=n1 Default=YES State=UP\n")
    return str(conf)


def test_the_dashboard_says_slurm_is_not_answering_and_recovers_when_it_answers(slurm_cluster, tmp_path,
                                                                                monkeypatch):
    from workbench.launch import run as run_module

    monkeypatch.setattr(run_module, "SCHEDULER_RETRY_S", 1.0)  # ask again every second, not every 10
    cfg = JobConfig.from_dict({
        "task": {"options": {"n_train": 1024, "n_val": 128}}, "train": ENDLESS,
        "dist": {"nodes": 1, "procs_per_node": 2, "timeout_s": 120},
        "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"), "time_limit": "10",
                   "slurm": {"partition": slurm_cluster.partition, "cpus_per_task": 1}}})
    run = workbench.submit(cfg)
    cluster_conf = os.environ["SLURM_CONF"]
    dash = None
    try:
        wait_for_step(run, 2, timeout=240)
        dash = run.dashboard(poll_s=0.5)
        monkeypatch.setenv("SLURM_CONF", _down_conf(tmp_path))
        wait_until(lambda: dash.state is not None and dash.state.scheduler_error != "", 60,
                   "the dashboard's line about SLURM")
        banner = re.sub(r"<[^>]+>", "", dash.scheduler.value)
        assert f"SLURM cannot be asked about job {run.job.job_id}: sacct failed" in banner, banner
        assert "Traceback" not in dash.error.value + banner and dash.running
        step = dash.state.step
        wait_until(lambda: dash.state.step > step, 120, "the dashboard following the run folder meanwhile")

        monkeypatch.setenv("SLURM_CONF", cluster_conf)  # SLURM answers again
        wait_until(lambda: dash.state.scheduler_error == "" and dash.scheduler.layout.display == "none", 60,
                   "the line cleared by itself")
        assert dash.running and dash.state.state == "running" and dash.error.value == ""
    finally:
        monkeypatch.setenv("SLURM_CONF", cluster_conf)  # whatever happened: the job is cancelled on the cluster
        if dash is not None:
            dash.stop()
        run.cancel()
    assert run.wait(timeout=120).state == "cancelled"
