"""The workbench on a real SLURM cluster (slurmctld + two slurmd nodes on this machine)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

import workbench
from tests.support.lifecycle import ENDLESS, wait_for_step
from tests.support.tasks_for_tests import failing_at, gated, slow
from workbench.config import JobConfig
from workbench.errors import ConfigError

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]


def _cfg(tmp_path: Path, cluster, nodes: int = 1, procs: int = 2, **train) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 1024, "n_val": 128}},
        "train": {"micro_batch_size": 16, "epochs": 50, "max_steps": 20, "checkpoint_every_steps": 10, **train},
        "dist": {"nodes": nodes, "procs_per_node": procs, "timeout_s": 60},
        "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"), "time_limit": "5",
                   "slurm": {"partition": cluster.partition, "cpus_per_task": 1}},
    })


def _endless(tmp_path: Path, cluster, nodes: int, procs: int, **train) -> JobConfig:
    """A run only the test ends: no step or epoch limit it reaches, and no time limit within the test
    (its USR2 would requeue the job, 90 s before 10 minutes)."""
    return _cfg(tmp_path, cluster, nodes, procs, **ENDLESS, **train).replace(launch__time_limit="10")


@pytest.mark.parametrize("nodes, procs, strategy", [(1, 2, "ddp"), (2, 1, "ddp"), (2, 2, "fsdp2")])
def test_ddp_run_on_slurm_writes_metrics_for_every_rank(slurm_cluster, tmp_path, nodes, procs, strategy):
    run = workbench.submit(_cfg(tmp_path, slurm_cluster, nodes, procs).replace(dist__strategy=strategy))
    status = run.wait(timeout=240)
    assert status.state == "finished", (run.exception(), run.logs(0))
    frame = run.metrics()
    world = nodes * procs
    assert sorted(frame["rank"].unique()) == list(range(world))
    assert (frame.groupby("rank")["step"].max() == 20).all()
    hosts = {r.host for r in status.ranks}
    assert hosts == ({"n1", "n2"} if nodes == 2 else hosts) and all(hosts)  # SLURM node names
    reattached = workbench.Run.load(run.folder)
    assert reattached.status().state == "finished"
    assert len(reattached.metrics()) == len(frame)
    if strategy == "fsdp2":  # 4 ranks on 2 nodes, each writing its own shards of the checkpoint
        shards = sorted(p.name for p in (run.folder / "checkpoints" / "step-00000020").glob("*.distcp"))
        assert shards == [f"__{r}_0.distcp" for r in range(world)]


def test_failing_rank_on_slurm_is_named_with_its_traceback(slurm_cluster, tmp_path):
    cfg = _cfg(tmp_path, slurm_cluster, 2, 1, max_steps=100000, checkpoint_every_steps=None)
    run = workbench.submit(cfg, task=functools.partial(failing_at, 10, rank=1, n_train=1024, n_val=128))
    status = run.wait(timeout=200)  # inside dist.timeout_s (600 s): the others did not wait it out
    assert status.state == "failed"
    assert [r.state for r in status.ranks] == ["aborted", "failed"], "rank 0 was stopped, not timed out"
    failure = run.exception()
    assert failure.rank == 1 and "injected failure on rank 1" in failure.traceback


def test_cancel_and_reattach_on_slurm(slurm_cluster, tmp_path):
    cfg = _endless(tmp_path, slurm_cluster, 1, 2, checkpoint_every_steps=None)
    run = workbench.submit(cfg, task=functools.partial(slow, 0.05, n_train=1024, n_val=128))
    wait_for_step(run, 3, timeout=120)
    reattached = workbench.Run.load(run.folder)  # as after a kernel restart: the job keeps running
    assert reattached.status().state == "running"
    reattached.cancel()
    assert reattached.wait(timeout=120).state == "cancelled"
    assert run.job.state.startswith("CANCELLED")


def test_preemption_signal_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path):
    """SLURM's preemption / time-limit warning is SIGUSR2 to the job's tasks; sent here with scancel."""
    import subprocess

    cfg = _cfg(tmp_path, slurm_cluster, 1, 2, max_steps=60, checkpoint_every_steps=1000)
    # the ranks hold after step 10 until the signal reaches them: the run cannot end unpreempted
    task = functools.partial(gated, str(tmp_path / "gate"), 10, delay_s=0.05, open_on_signal=True, n_train=4096,
                             n_val=128)
    run = workbench.submit(cfg, task=task)
    wait_for_step(run, 10, timeout=120)
    subprocess.run(["scancel", "--signal=USR2", str(run.job.job_id)], check=True, timeout=30)
    status = run.wait(timeout=280)
    assert status.state == "finished", (run.exception(), run.logs(0))
    events = run.events()
    assert set(events[events["event"] == "preempted"]["rank"]) == {0, 1}
    assert "resume" in set(events["event"])
    frame = run.metrics()
    assert frame.groupby("rank")["step"].apply(list).tolist() == [list(range(1, 61))] * 2
    assert frame["attempt"].max() == 1
    assert len((run.folder / "metrics" / "rank0.jsonl").read_text().splitlines()) == 60


def test_bad_partition_fails_before_submission(slurm_cluster, tmp_path):
    cfg = _cfg(tmp_path, slurm_cluster).replace(launch__slurm={"partition": "nosuch"})
    with pytest.raises(ConfigError, match="launch.slurm.partition.*nosuch.*debug"):
        workbench.submit(cfg)
    assert not (tmp_path / "runs").exists()


def _tree(folder: Path) -> set[str]:
    """The run folder's layout: its top-level entries and the per-rank files (logs and pickles aside)."""
    kinds = ("metrics", "events", "status")
    top = {p.name for p in folder.iterdir() if not p.name.startswith(".")}  # lock files: how it was submitted
    return top | {f"{k}/{p.name}" for k in kinds for p in (folder / k).iterdir()}


def test_exported_sbatch_script_runs_and_writes_a_run_folder(slurm_cluster, tmp_path):
    """`workbench export CONFIG --sbatch` (one torchrun per node through srun, c10d rendezvous on the
    first node): sbatch it as a user would and compare its run folder with a submitted run's."""
    import subprocess

    from workbench.launch.export import sbatch_script

    cfg = _cfg(tmp_path, slurm_cluster, nodes=2, procs=1).replace(launch__name="exported")
    config_path = tmp_path / "job.yaml"
    cfg.to_yaml(config_path)
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(cfg, str(config_path)))
    out = subprocess.run(["sbatch", "--parsable", str(script)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=True)
    job_id = out.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        state = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
        if state and not state.startswith(("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")):
            break
        time.sleep(1)
    job_log = (tmp_path / f"wb-exported-{job_id}.out")
    log_text = job_log.read_text() if job_log.exists() else "(no job log)"
    assert state == "COMPLETED", f"{state}\n{log_text[-3000:]}"
    run_dir = tmp_path / "runs" / f"exported-{job_id}"
    exported = workbench.Run.load(run_dir)
    status = exported.status()
    assert status.state == "finished" and [r.step for r in status.ranks] == [20, 20], log_text[-3000:]
    assert {r.host for r in status.ranks} == {"n1", "n2"}  # one rank on each node
    assert exported.meta["executor"] == "torchrun"
    frame = exported.metrics()
    assert (frame.groupby("rank")["step"].max() == 20).all() and frame["loss_reduced"].notna().all()
    submitted = workbench.submit(cfg)
    assert submitted.wait(timeout=240).state == "finished", submitted.exception()
    assert _tree(run_dir) - {"rendezvous"} == _tree(submitted.folder) - {"rendezvous"}


def test_max_restarts_on_slurm_restarts_every_rank_within_the_job(slurm_cluster, tmp_path):
    """A rank raises; launch.max_restarts: 1 starts both ranks (on two nodes) again inside the same
    allocation, from the latest checkpoint; the steps continue and the failure is kept."""
    from tests.support.lifecycle import assert_nothing_left, metric_steps, wait_until
    from tests.support.tasks_for_tests import failing_on_first_attempt

    cfg = _cfg(tmp_path, slurm_cluster, 2, 1, max_steps=40).replace(launch__max_restarts=1)
    run = workbench.submit(cfg, task=functools.partial(failing_on_first_attempt, 26, rank=1, n_train=1024,
                                                       n_val=128))
    status = run.wait(timeout=300)
    assert status.state == "finished", (run.exception(), run.logs(1))
    failures = run.failures()
    assert [(f.rank, f.attempt) for f in failures] == [(1, 0)]
    assert "injected failure on rank 1" in failures[0].traceback
    assert metric_steps(run) == [list(range(1, 41))] * 2
    assert len(run.meta["job_ids"]) == 1, "restarted within the job, not requeued"
    wait_until(lambda: run.job.state == "COMPLETED", 60, f"sacct says COMPLETED (says {run.job.state})")
    events = run.events()
    assert len(events[events["event"] == "restart"]) == 1
    assert_nothing_left(run.folder)


def test_a_hung_rank_on_slurm_is_lost_and_its_job_ends_by_itself(slurm_cluster, tmp_path):
    """SIGSTOP one rank: its neighbour reports it lost, the agents end every worker and the job
    ends FAILED by itself (a cancel by this handle would read CANCELLED)."""
    import os
    import signal

    from tests.support.lifecycle import assert_nothing_left, report, wait_until
    from workbench.runfolder.layout import read_json

    cfg = _endless(tmp_path, slurm_cluster, 2, 1, checkpoint_every_steps=10)
    cfg = cfg.replace(dist__timeout_s=600, dist__lost_after_s=10)  # lost after 10 s without a heartbeat
    run = workbench.submit(cfg, task=functools.partial(slow, 0.02, n_train=1024, n_val=128))
    wait_for_step(run, 12, timeout=200)
    os.kill(read_json(run.dir.status(1))["pid"], signal.SIGSTOP)  # the nodes share this machine
    stopped = time.monotonic()
    status = run.wait(timeout=240)
    report("SIGSTOPped rank on SLURM -> run failed, rank 1 lost", time.monotonic() - stopped)
    assert status.state == "failed"
    failure = run.exception()
    assert failure.rank == 1 and failure.type == "Lost" and "no heartbeat" in failure.message
    wait_until(lambda: run.job.state != "RUNNING", 60, "sacct reports the job's end")
    assert run.job.state.startswith("FAILED"), run.job.state
    assert (tmp_path / "runs").exists() and list(run.folder.glob("checkpoints/step-*.pt"))
    assert_nothing_left(run.folder)
