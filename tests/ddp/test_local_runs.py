"""End-to-end local runs through workbench.submit (submitit LocalExecutor, 2 ranks, gloo, CPU)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import workbench
from tests.support.lifecycle import ENDLESS, report, run_processes, wait_for_step
from tests.support.runs import local_cfg
from tests.support.tasks_for_tests import failing_at, gated
from workbench.config import JobConfig
from workbench.errors import NotSignalledWarning
from workbench.launch.ours import signallable
from workbench.launch.run import ROLES

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]


def _cfg(tmp_path: Path, **train) -> JobConfig:
    return local_cfg(tmp_path, **train)


def test_run_trains_every_rank_and_writes_results(finished_run):
    run = finished_run
    frame = run.metrics()
    assert set(frame["rank"]) == {0, 1}
    assert frame.groupby("rank")["step"].max().tolist() == [40, 40]
    for column in ("loss", "loss_reduced", "lr", "samples_per_s", "step_time_s", "mem_mb", "epoch", "time"):
        assert frame[column].notna().all(), column
    # the reduced loss is the mean of the ranks' local losses at each step
    means = frame.groupby("step")["loss"].mean()
    reduced = frame.groupby("step")["loss_reduced"].first()
    assert (means - reduced).abs().max() < 1e-5
    assert run.result()["steps"] == 40
    assert set(run.events()["event"]) >= {"start", "checkpoint", "end"}
    assert (run.folder / "config.yaml").exists() and oct(run.folder.stat().st_mode)[-3:] == "700"
    assert not run_processes(run.folder)


def test_resume_after_a_crash_reproduces_the_uninterrupted_losses(tmp_path, finished_run):
    reference = finished_run  # the same job, never interrupted
    crashed = workbench.submit(_cfg(tmp_path), task=functools.partial(failing_at, 25 + 1, n_train=2048,
                                                                       n_val=256, dropout=0.1))
    assert crashed.wait(timeout=180).state == "failed"
    assert crashed.exception().rank == 1
    assert "injected failure" in crashed.exception().traceback
    checkpoints = sorted(p.name for p in (crashed.folder / "checkpoints").glob("step-*.pt"))
    assert checkpoints[-1] == "step-00000020.pt", "the crash must not lose the finished checkpoint"
    assert crashed.metrics()["step"].max() >= 20, "metrics logged before the crash are kept"

    resumed = workbench.submit(_cfg(tmp_path), run_dir=crashed.folder)
    assert resumed.wait(timeout=180).state == "finished", resumed.exception()
    want = reference.metrics().set_index(["rank", "step"])["loss"]
    got = resumed.metrics().set_index(["rank", "step"])["loss"]
    assert list(got.index) == list(want.index)
    assert (got - want).abs().max() == 0.0, "resumed losses must equal the uninterrupted run's"
    assert "resume" in set(resumed.events()["event"])


def test_a_finished_run_continued_to_more_steps_trains_its_next_step_on_the_longer_schedule(tmp_path, finished_run):
    """max_steps 40 -> 46 on a copy of the finished run: the cosine decay is now longer, so step 41 trains
    at the new schedule's lr.  The checkpoint's optimizer held the old schedule's lr for step 41, the end
    of its decay (0): that step trained at lr 0 and only step 42 was on the new schedule."""
    from workbench.engine.optim import lr_factor

    copy = tmp_path / "copy"
    shutil.copytree(finished_run.folder, copy)
    longer = workbench.submit(_cfg(tmp_path, max_steps=46), run_dir=copy)
    assert longer.wait(timeout=180).state == "finished", longer.exception()
    lrs = longer.metrics().query("rank == 0 and step > 40").set_index("step")["lr"]
    start = longer.events().query("event == 'start' and rank == 0").sort_values("time").iloc[-1]
    assert (start["total_steps"], start["lr"], start["warmup_steps"]) == (46, 2e-2, 10)  # scaled: 2 ranks
    factor = lr_factor("cosine", 10, 46, 0.0)
    assert lrs.tolist() == pytest.approx([2e-2 * factor(step - 1) for step in range(41, 47)], rel=1e-6)
    assert lrs[41] > 1e-5, "step 41 trained at the old schedule's last lr"


def test_early_stop_stops_every_rank_at_the_same_step(tmp_path):
    cfg = _cfg(tmp_path, eval_every_steps=5, max_steps=200,
               early_stopping={"patience": 2, "min_delta": 100.0})
    run = workbench.submit(cfg)
    assert run.wait(timeout=180).state == "finished", run.exception()
    last = run.metrics().groupby("rank")["step"].max()
    assert last.tolist() == [15, 15]  # first eval sets the best; two more without improvement
    events = run.events()
    assert sorted(events[events["event"] == "early_stop"]["rank"]) == [0, 1]
    assert run.result()["stop_reason"] == "early_stop"


def test_a_failing_rank_fails_the_run_fast_and_stops_the_others(tmp_path):
    run = workbench.submit(_cfg(tmp_path, max_steps=100000, checkpoint_every_steps=None),
                           task=functools.partial(failing_at, 15, rank=1, n_train=2048, n_val=256))
    status = run.wait(timeout=120)  # far inside dist.timeout_s (600 s): the others did not wait it out
    assert status.state == "failed"
    assert [r.state for r in status.ranks] == ["aborted", "failed"], "rank 0 was stopped, not timed out"
    failure = run.exception()
    report("raising rank -> run failed, rank named", time.time() - failure.time)
    assert failure.rank == 1 and failure.type == "RuntimeError"
    assert "injected failure on rank 1" in failure.traceback
    assert not run_processes(run.folder), "no orphan processes after a failure"
    with pytest.raises(workbench.RunFailed, match="rank 1"):
        run.result()


def test_a_killed_rank_is_named_and_the_others_stop(tmp_path):
    run = workbench.submit(_cfg(tmp_path, max_steps=100000, checkpoint_every_steps=None),
                           task=functools.partial(failing_at, 15, rank=1, how="kill", n_train=2048, n_val=256))
    status = run.wait(timeout=120)
    assert status.state == "failed"
    report("SIGKILLed rank -> run failed, rank named lost", time.time() - run.exception().time)
    assert run.exception().rank == 1 and run.exception().type == "Lost"
    assert "killed by SIGKILL" in run.exception().message
    assert not run_processes(run.folder)


def test_cancel_stops_every_rank_and_keeps_results(tmp_path):
    run = workbench.submit(_cfg(tmp_path, **ENDLESS, checkpoint_every_steps=20))  # only the cancel ends it
    wait_for_step(run, 30, timeout=90)
    ours, refused = signallable(run.dir, ROLES)  # the folder names its controller, agents and workers: all ours
    assert refused == [] and len(ours) == 5, refused
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotSignalledWarning)
        run.cancel()
    status = run.wait(timeout=60)
    report("Run.cancel() -> every rank stopped, run cancelled", time.monotonic() - started)
    assert status.state == "cancelled" and run.not_signalled == ""
    assert len(run.metrics()) > 0
    assert list((run.folder / "checkpoints").glob("step-*.pt"))
    assert not run_processes(run.folder)


def test_torchrun_runs_the_same_engine(tmp_path):
    cfg = _cfg(tmp_path, max_steps=10)
    path = tmp_path / "job.yaml"
    cfg.to_yaml(path)
    run_dir = tmp_path / "torchrun-run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "workbench.train", str(path), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    frame = workbench.Run.load(run_dir).metrics()
    assert frame.groupby("rank")["step"].max().tolist() == [10, 10]


def test_cli_run_prints_per_rank_results_and_fails_on_bad_config(tmp_path):
    path = tmp_path / "job.yaml"
    _cfg(tmp_path, max_steps=8).to_yaml(path)
    ok = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(path), "--nproc", "2"],
                        capture_output=True, text=True, timeout=180)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "run folder:" in ok.stdout and "per-rank plot:" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(path), "--set", "train.lr=-1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "train.lr" in bad.stderr


def test_a_fresh_kernels_first_submit_of_a_config_does_not_import_torch(tmp_path):
    """Notebook 01's shape: a config, no factory.  On a machine with no GPU the submitting process
    learns "no GPUs" and "a fresh run folder" without torch's import (2-3 s of a first submit)."""
    cfg = _cfg(tmp_path, max_steps=3, checkpoint_every_steps=None)
    cfg.to_yaml(tmp_path / "job.yaml")
    code = (f"import sys, workbench; cfg = workbench.JobConfig.from_yaml({str(tmp_path / 'job.yaml')!r}); "
            "run = workbench.submit(cfg); print('torch' in sys.modules); run.wait(timeout=150); "
            "print(run.status().state, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "finished", "False"], out.stdout + out.stderr[-3000:]


def test_preemption_signal_checkpoints_requeues_and_resumes_with_continuous_steps(tmp_path):
    import signal

    from workbench.runfolder.layout import read_json

    cfg = _cfg(tmp_path, max_steps=60, checkpoint_every_steps=1000)
    # the ranks hold after step 10 until the signal reaches them: the run cannot end unpreempted
    task = functools.partial(gated, str(tmp_path / "gate"), 10, delay_s=0.05, open_on_signal=True, n_train=2048,
                             n_val=256, dropout=0.1)
    run = workbench.submit(cfg, task=task)
    wait_for_step(run, 10, timeout=90)
    pids = [read_json(run.dir.status(r))["pid"] for r in (0, 1)]
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)  # what SLURM / submitit send before a time limit
    signalled = time.time()
    status = run.wait(timeout=150)
    requeued = run.events().query("event == 'resume'")["time"].min()
    report("preemption signal -> checkpointed, requeued, resumed (first resume event)", requeued - signalled)
    assert status.state == "finished", run.exception()
    events = run.events()
    preempted = events[events["event"] == "preempted"]
    assert sorted(preempted["rank"]) == [0, 1] and preempted["step"].nunique() == 1
    resumed = events[events["event"] == "resume"]
    assert len(resumed) == 2 and (resumed["attempt"] >= 0).all()
    frame = run.metrics()
    assert frame.groupby("rank")["step"].apply(list).tolist() == [list(range(1, 61))] * 2
    raw = [line for line in (run.folder / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert len(raw) == 60, "nothing past the preemption checkpoint is trained twice"
    assert not run_processes(run.folder)
