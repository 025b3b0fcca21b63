"""Failures on a real SLURM cluster (slurmctld + two slurmd nodes on this machine), as the agents see
them there: a raising rank named with the user's frame and no workbench frames, its interleaved log
in the run folder; a hung rank named with its collective and frame; torch's @record error file read into the
failure; nothing of the job left.  And a SLURM whose accounting does not answer (a real slurm.conf
pointing at a closed port): the job's state is one `workbench:` line in SLURM's words (exit 2 in the
CLI), never submitit's "Bypassing sacct error" warnings."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import CLI, ENDLESS, assert_nothing_left, run_processes, wait_for_step, wait_until
from tests.support.slurm_cluster import closed_port
from workbench.config import JobConfig
from workbench.errors import SubmitError

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

FAULTS = SCRIPTS / "faults.py"
ENGINE_FRAMES = ("workbench/engine", "workbench/launch", "submitit", "runpy", "RankFailed")


def _cfg(tmp_path: Path, cluster, **dist) -> JobConfig:
    return JobConfig.from_dict({
        "dist": {"nodes": 2, "procs_per_node": 1, "timeout_s": 120, **dist},
        "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"), "time_limit": "10",
                   "slurm": {"partition": cluster.partition, "cpus_per_task": 1}},
    })


def _no_workbench_frames(text: str) -> None:
    shown = [frame for frame in ENGINE_FRAMES if frame in text]
    assert not shown, f"workbench's own frames reached the user ({shown}):\n{text}"


def _job_gone(run) -> None:
    wait_until(lambda: run.job.done(), 120, "SLURM reports the job's end")
    assert_nothing_left(run.folder)


def test_a_raising_rank_on_slurm_is_named_in_its_own_frames_with_its_log(slurm_cluster, tmp_path):
    run = workbench.submit_script(FAULTS, ["raise", "1"], _cfg(tmp_path, slurm_cluster))
    assert run.wait(timeout=300).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type, failure.attempt) == (1, "ValueError", 0), failure
    assert "injected failure on rank 1" in failure.message and failure.host in ("n1", "n2")
    assert 'faults.py", line' in failure.traceback and "in loss_fn" in failure.traceback
    _no_workbench_frames(failure.traceback)
    assert [f.rank for f in run.failures()][:1] == [1]
    assert run.dir.both_streams(1).exists(), "the agent's tee wrote the rank's interleaved log"
    log = run.logs(1)
    assert "ValueError: injected failure on rank 1" in log and "in loss_fn" in log, log
    _no_workbench_frames(log)
    shown = subprocess.run([*CLI, "show", str(run.folder)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "rank 1" in shown.stderr and "injected failure" in shown.stderr, shown
    _job_gone(run)


def test_a_hung_rank_on_slurm_is_named_with_its_collective_and_frame(slurm_cluster, tmp_path):
    """Two nodes, one rank each, through the SLURM executor: rank 1 loops in its loss, rank 0 waits for its
    gradients; the flight recorder every rank's agent turns on, here on its SLURM node, names the collective."""
    run = workbench.submit_script(FAULTS, ["hang", "1"], _cfg(tmp_path, slurm_cluster, stall_after_s=3))
    assert run.wait(timeout=300).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "Hung"), failure.summary()
    assert "faults.py:" in failure.where and failure.where.endswith("in loss_fn"), failure.where
    assert "rank 0 waits for it in a collective (all_reduce #" in failure.message, failure.message
    assert "which rank 1 never entered" in failure.message, failure.message
    assert [f.rank for f in failure.consequences] == [0], failure.summary()
    _job_gone(run)


def test_the_record_error_file_on_slurm_is_read_into_the_failure(slurm_cluster, tmp_path):
    script = tmp_path / "recorded.py"
    shutil.copy(SCRIPTS / "recorded.py", script)
    run = workbench.submit_script(script, [], _cfg(tmp_path, slurm_cluster))
    assert run.wait(timeout=300).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "KeyError") and "from a recorded main" in failure.message, failure
    assert "recorded.py" in failure.traceback
    _job_gone(run)


# --- SLURM's accounting does not answer ---------------------------------------------------------------


@pytest.fixture
def no_accounting(tmp_path: Path) -> dict[str, str]:
    """The environment of a login node whose SLURM controller and accounting database do not answer."""
    port = closed_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    "AuthType=auth/munge\nAccountingStorageType=accounting_storage/slurmdbd\n"
                    f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={port}\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=n1 Default=YES State=UP\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


@pytest.mark.usefixtures("slurm_clients")
def test_a_job_state_sacct_cannot_give_is_one_line_in_slurms_words(no_accounting, tmp_path, monkeypatch, caplog):
    from workbench.launch.executors import SlurmJob

    monkeypatch.setenv("SLURM_CONF", no_accounting["SLURM_CONF"])
    with pytest.raises(SubmitError) as caught:
        SlurmJob(folder=tmp_path, job_id="4242").done()
    message = str(caught.value)
    assert message.startswith("sacct failed (exit 1): sacct: error: ") and "Connection refused" in message, message
    assert "\n" not in message and "does not answer" in message, message
    assert "Bypassing" not in caplog.text, "submitit's warning"


def test_show_of_a_running_job_without_accounting_is_one_line_and_exit_2(slurm_cluster, no_accounting, tmp_path):
    cfg = _cfg(tmp_path, slurm_cluster).replace(task__options={"n_train": 1024, "n_val": 128}, **{
        f"train__{k}": v for k, v in ENDLESS.items()})
    run = workbench.submit(cfg)
    try:
        wait_for_step(run, 2, timeout=240)
        shown = subprocess.run([*CLI, "show", str(run.folder)], env=no_accounting, capture_output=True, text=True,
                               timeout=120)
        assert shown.returncode == 2, shown
        lines = shown.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("workbench: sacct failed (exit 1): sacct: error: "), lines
        assert "Bypassing" not in shown.stderr and "Traceback" not in shown.stderr
    finally:
        run.cancel()
    assert run.wait(timeout=120).state == "cancelled"
    wait_until(lambda: not run_processes(run.folder), 60, "scancel's end of the job's processes (KillWait)")
