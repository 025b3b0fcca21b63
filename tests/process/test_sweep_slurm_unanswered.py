"""A SLURM sweep while SLURM does not answer (its controller is down): the array's sbatch refused is
one line carrying SLURM's words; a queue that cannot be read is said once and read again later (the
driver goes on); a cancel that cannot reach SLURM says what is left and how to end it.

SLURM's silence is real: the SLURM client binaries read a slurm.conf whose controller port is a
closed loopback port, so sbatch, squeue and scancel fail with their own words ("Unable to contact
slurm controller").  No cluster is started, no job submitted."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import workbench
from tests.support.slurm_cluster import closed_port
from workbench.config import JobConfig
from workbench.errors import SubmitError
from workbench.sweeps.array import shape_key

optuna = pytest.importorskip("optuna")
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("slurm_clients")]


@pytest.fixture
def slurm_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    "AuthType=auth/munge\nMessageTimeout=2\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=n1 Default=YES State=UP\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))


def _cfg(tmp_path: Path) -> JobConfig:
    return JobConfig.from_dict({"dist": {"nodes": 1, "procs_per_node": 1},
                                "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"),
                                           "slurm": {"partition": "debug"}}})


def test_an_array_sbatch_refuses_is_one_line_in_slurms_words(slurm_down, tmp_path):
    sweep = workbench.sweep(_cfg(tmp_path), {"train.lr": [1e-3, 1e-2]}, pruner="none")
    with pytest.raises(SubmitError) as err:
        sweep.wait(timeout=100)
    line = str(err.value)
    assert "\n" not in line and line.startswith("sbatch failed (exit 1): ")
    assert "Unable to contact slurm controller" in line and "check that `sinfo` works here" in line
    assert not (sweep.dir.read_meta() or {}).get("arrays") and sweep.runs == []


def test_a_queue_that_cannot_be_read_is_said_once_and_a_cancel_says_what_is_left(slurm_down, tmp_path):
    cfg = _cfg(tmp_path)
    sweep = workbench.sweep(cfg, {"train.lr": [1e-3, 1e-2]}, pruner="none", background=False)
    # as if the driver had submitted its array before SLURM stopped answering
    sweep.dir.update_meta(arrays=[{"job_id": "4242", "size": 2, "shape": shape_key(cfg), "after": [],
                                   "submitted": time.time()}])
    with pytest.raises(TimeoutError):
        sweep.wait(timeout=5)  # the driver goes on: no error, only the line
    said = [line for line in sweep.events if "squeue" in line]
    assert len(said) == 1, sweep.events
    assert re.fullmatch(r"squeue failed \(exit 1\): .*Unable to contact slurm controller.*; the sweep cannot tell "
                        r"which of its array elements are queued: check that `squeue` works here "
                        r"\(read again every 15 s\)", said[0]), said[0]
    with pytest.raises(SubmitError) as err:
        sweep.cancel()
    line = str(err.value)
    assert "\n" not in line and line.startswith("squeue failed (exit 1): ")
    assert line.endswith("the sweep's elements still queued end as they start (sweep.json says it is over); "
                         "scancel 4242 once SLURM answers")
    assert (sweep.dir.read_meta() or {}).get("cancelled")  # what the elements read: they end as they start
