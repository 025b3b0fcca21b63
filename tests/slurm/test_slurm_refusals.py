"""When SLURM refuses (its controller does not answer, a job it rejects, a scancel that fails), the
user gets one `workbench:` line carrying SLURM's own message and exit status 2, not submitit's
traceback, and no run folder is left for a job that never existed.

The unreachable controller is real: the SLURM clients read a slurm.conf whose controller port is a
closed loopback port.  They need only the SLURM client binaries (installed by the cluster fixture);
the rejected job needs the real test cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.slurm_cluster import closed_port
from workbench.errors import SubmitError

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

QUICKSTART = str(REPO / "examples" / "quickstart.yaml")
needs_clients = pytest.mark.usefixtures("slurm_clients")


@pytest.fixture
def unreachable(tmp_path: Path) -> dict[str, str]:
    """The environment of a login node whose SLURM controller does not answer."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={closed_port()}\n"
                    "AuthType=auth/munge\nMessageTimeout=2\n"  # clients give up on the controller in 2 s, not 10
                    "NodeName=n1 CPUs=1 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=n1 Default=YES State=UP\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def _workbench(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["workbench", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=200)


@needs_clients
def test_no_controller_is_one_line_with_slurms_message_and_no_run_folder(unreachable, tmp_path):
    runs = tmp_path / "runs"
    done = _workbench(["run", QUICKSTART, "--executor", "slurm", "--set", f"launch.run_root={runs}"], unreachable,
                      tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: sbatch failed (exit 1): sbatch: error: "), done.stderr
    assert "Traceback" not in done.stderr and "bug in workbench" not in done.stderr
    assert not list(runs.glob("*/run.json")), "a run folder was left for a job SLURM never took"


@needs_clients
def test_a_failing_scancel_is_one_line_with_slurms_message(unreachable, tmp_path, monkeypatch):
    from workbench.launch.executors import SlurmJob

    monkeypatch.setenv("SLURM_CONF", unreachable["SLURM_CONF"])
    with pytest.raises(SubmitError) as caught:
        SlurmJob(folder=tmp_path, job_id="4242").cancel()
    message = str(caught.value)
    assert message.startswith("scancel 4242 failed (exit ") and "): scancel: error: " in message, message
    assert "\n" not in message and "does not answer" in message, message


def test_a_job_the_cluster_rejects_is_one_line_with_slurms_message(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    args = ["run", QUICKSTART, "--executor", "slurm", "--detach",  # returns at once should SLURM take it
            "--set", f"launch.run_root={runs}", "--set", f"launch.slurm.partition={slurm_cluster.partition}",
            "--set", "launch.slurm.constraint=no-such-feature"]
    done = _workbench(args, {**os.environ, **slurm_cluster.env}, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("workbench: sbatch failed (exit 1): sbatch: error: Batch job submission failed: "
                               "Invalid feature specification"), lines
    assert "launch.slurm" in lines[0]  # and what to check
    assert not list(runs.glob("*/run.json"))
