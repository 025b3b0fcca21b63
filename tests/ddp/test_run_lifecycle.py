"""A run's life, with faults caused for real (2 ranks, gloo, CPU): the submitter killed with its whole
process group (a kernel restart), a hung rank, the CLI stopped every way, a detached run, restarts
after a failure, and the one-live-job rule.  Each test checks what the user sees, that metrics and
the last good checkpoint are intact, and that no process of the run is left."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import workbench
from tests.support.lifecycle import (
    CLI,
    ENDLESS,
    OPTIONS,
    as_from_a_terminal,
    assert_nothing_left,
    cfg,
    checkpoint_steps,
    gated_cfg,
    metric_steps,
    report,
    run_processes,
    slow_task_cfg,
    wait_for_step,
)
from tests.support.tasks_for_tests import failing_on_first_attempt, slow
from workbench.errors import SubmitError
from workbench.proctree import Proc
from workbench.runfolder.layout import read_json

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]

SUBMITTER = """
import sys, time, workbench
from workbench.config import JobConfig
run = workbench.submit(JobConfig.from_yaml(sys.argv[1]))
print(run.folder, flush=True)
time.sleep(600)
"""


def test_killing_the_submitters_process_group_leaves_the_run_training(tmp_path):
    """What a Jupyter kernel restart does: SIGKILL to the kernel's whole process group."""
    from workbench.ui.state import read_state

    path = tmp_path / "job.yaml"
    job, gate = gated_cfg(tmp_path, 10, 0.03, max_steps=120, checkpoint_every_steps=20)  # holds after step 10
    job.to_yaml(path)
    kernel = subprocess.Popen([sys.executable, "-c", SUBMITTER, str(path)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    folder = __import__("pathlib").Path(kernel.stdout.readline().strip())
    run = workbench.Run.load(folder)
    at_kill = wait_for_step(run, 10)
    controller = read_json(run.dir.meta)["controller"]
    assert controller["pgid"] != kernel.pid, "the run must not be in the submitter's process group"
    os.killpg(kernel.pid, signal.SIGKILL)
    killed = time.monotonic()
    kernel.wait(timeout=10)

    reattached = workbench.Run.load(folder)
    state = read_state(reattached, 500)  # what the dashboard shows
    report("kernel restart -> Run.load shows the run still running", time.monotonic() - killed)
    assert state.state == "running" and not state.failure, state
    assert all(b.state == "running" for b in state.badges)
    gate.touch()
    wait_for_step(reattached, at_kill + 10, timeout=60)  # it trains on without its submitter
    status = reattached.wait(timeout=240)
    assert status.state == "finished", reattached.exception()
    assert read_state(reattached, 500).state == "finished"
    assert metric_steps(reattached) == [list(range(1, 121))] * 2
    assert checkpoint_steps(folder)[-1] == 120
    assert_nothing_left(folder)


def test_a_stopped_rank_is_named_lost_and_killed_with_the_run(tmp_path):
    """SIGSTOP (a hung rank): its neighbour reports it lost after dist.lost_after_s (short here),
    every rank's agent ends its worker, and the stopped process does not survive."""
    run = workbench.submit(cfg(tmp_path, **ENDLESS, checkpoint_every_steps=10,
                               dist={"timeout_s": 600, "lost_after_s": 10}),
                           task=functools.partial(slow, 0.02, **OPTIONS))
    wait_for_step(run, 12)
    stopped = read_json(run.dir.status(1))["pid"]
    os.kill(stopped, signal.SIGSTOP)
    started = time.monotonic()
    status = run.wait(timeout=200)
    report("SIGSTOPped rank -> run failed, rank 1 lost", time.monotonic() - started)
    assert status.state == "failed"
    failure = run.exception()
    assert failure.rank == 1 and failure.type == "Lost" and "no heartbeat" in failure.message
    # its process was still there (stopped), seen from its node: it stopped answering, it was not killed
    assert "stopped answering" in failure.message and "SIGSTOP" in failure.message, failure.message
    assert "killed" not in failure.message and "noticed by rank 0" in failure.message, failure.message
    # the collective rank 0 waits in (its flight recorder) and its frame: a stopped rank has no frame to read;
    # which one depends on where the stop landed: the step's gradient or loss all_reduce, or the all_gather of
    # a checkpoint's or a check's step (seen once: "all_gather #37")
    assert re.search(r"; rank 0 waits for it in (all_reduce|all_gather) #\d+", failure.message), failure.message
    steps = metric_steps(run)
    assert steps[0] == list(range(1, len(steps[0]) + 1)), "metrics logged before the hang are kept"
    assert checkpoint_steps(run.folder)[-1] >= 10
    assert not Proc(stopped).alive(), "the stopped process was killed"
    assert_nothing_left(run.folder)


def _start_cli(tmp_path, *extra):
    path = tmp_path / "job.yaml"
    slow_task_cfg(tmp_path, 0.03, **ENDLESS, checkpoint_every_steps=10).to_yaml(path)
    proc = subprocess.Popen([*CLI, "run", str(path), "--quiet", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    line = proc.stdout.readline()
    assert "run folder:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, __import__("pathlib").Path(line.split("run folder:")[1].strip())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stopping_the_cli_cancels_its_run(tmp_path, sig):
    proc, folder = _start_cli(tmp_path)
    run = workbench.Run.load(folder)
    wait_for_step(run, 12)
    os.kill(proc.pid, sig)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=90)
    report(f"{sig.name} to `workbench run` -> cancelled and reported", time.monotonic() - sent)
    assert proc.returncode == 128 + sig, (out, err)
    assert "cancelled (step" in out and "cancelling the run" in err, (out, err)
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out
    assert workbench.Run.load(folder).status().state == "cancelled"
    assert checkpoint_steps(folder) and metric_steps(run)[0][:12] == list(range(1, 13))
    assert_nothing_left(folder)


def test_killing_the_cli_outright_still_stops_its_run(tmp_path):
    proc, folder = _start_cli(tmp_path)
    run = workbench.Run.load(folder)
    wait_for_step(run, 12)
    proc.kill()  # SIGKILL: the CLI cannot react; the kernel tells its controller
    killed = time.monotonic()
    proc.communicate(timeout=30)
    status = run.wait(timeout=60)
    report("SIGKILL to `workbench run` -> run cancelled", time.monotonic() - killed)
    assert status.state == "cancelled" and "SIGTERM to the local controller" in run.meta["cancelled_by"]
    assert checkpoint_steps(folder)
    assert_nothing_left(folder)


def test_a_failing_follow_loop_cancels_the_run(tmp_path):
    """`workbench run ... | head -2`: the reader goes away, the next progress line fails (EPIPE)."""
    path = tmp_path / "job.yaml"
    slow_task_cfg(tmp_path, 0.03, **ENDLESS, checkpoint_every_steps=10).to_yaml(path)
    proc = subprocess.Popen([*CLI, "run", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    folder = __import__("pathlib").Path(proc.stdout.readline().split("run folder:")[1].strip())
    while "rank" not in proc.stdout.readline():  # the first progress line: it trains
        pass
    proc.stdout.close()
    closed = time.monotonic()
    err = proc.stderr.read()
    proc.wait(timeout=90)
    run = workbench.Run.load(folder)
    status = run.wait(timeout=60)
    report("follow loop failed (reader gone) -> run cancelled", time.monotonic() - closed)
    assert status.state == "cancelled" and "the follow loop failed: cancelling the run" in err, err
    assert_nothing_left(folder)


def test_a_detached_run_goes_on_is_followed_and_cancelled_by_command(tmp_path):
    path = tmp_path / "job.yaml"
    slow_task_cfg(tmp_path, 0.03, **ENDLESS, checkpoint_every_steps=10).to_yaml(path)
    detached = subprocess.run([*CLI, "run", str(path), "--detach"], capture_output=True, text=True, timeout=60)
    assert detached.returncode == 0, detached.stderr
    folder = __import__("pathlib").Path(detached.stdout.split("run folder:")[1].split()[0])
    assert f"workbench follow {folder}" in detached.stdout and f"workbench cancel {folder}" in detached.stdout
    run = workbench.Run.load(folder)
    wait_for_step(run, 5)  # the command has returned; the run trains

    follower = subprocess.Popen([*CLI, "follow", str(folder), "--quiet"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    assert "run folder:" in follower.stdout.readline()
    follower.send_signal(signal.SIGINT)  # stops following, not the run
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 130 and "the run goes on" in out and "Traceback" not in err
    assert run.status().state == "running"

    # the one-live-job rule: a second submission into this folder is refused
    second = subprocess.run([*CLI, "run", str(path), "--run-dir", str(folder)], capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 2 and "in use by local job" in second.stderr and "workbench cancel" in second.stderr
    with pytest.raises(SubmitError, match="in use by local job"):
        workbench.submit(slow_task_cfg(tmp_path), run_dir=folder)

    started = time.monotonic()
    cancel = subprocess.run([*CLI, "cancel", str(folder)], capture_output=True, text=True, timeout=60)
    report("`workbench cancel` of a detached run -> cancelled", time.monotonic() - started)
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout, (cancel.stdout, cancel.stderr)
    assert run.status().state == "cancelled"
    assert checkpoint_steps(folder)
    assert_nothing_left(folder)


def test_a_failure_restarts_every_rank_from_the_latest_checkpoint(tmp_path):
    run = workbench.submit(cfg(tmp_path, max_steps=40, launch={"max_restarts": 1}),
                           task=functools.partial(failing_on_first_attempt, 25 + 1, rank=1, **OPTIONS))
    status = run.wait(timeout=240)
    assert status.state == "finished", run.exception()
    failures = run.failures()
    assert len(failures) == 1 and failures[0].rank == 1 and failures[0].attempt == 0
    assert "injected failure on rank 1" in failures[0].traceback
    events = run.events()
    restart = events[events["event"] == "restart"]
    assert len(restart) == 1 and restart["failures"].iloc[0][0]["rank"] == 1
    resumed = events[(events["event"] == "resume") & (events["rank"] == 0)]
    assert resumed["path"].iloc[-1].endswith("step-00000020.pt") and resumed["attempt"].iloc[-1] == 1
    report("raising rank -> every rank restarted (error to restarted ranks' start)",
           float(events[events["event"] == "start"]["time"].max()) - failures[0].time)
    assert metric_steps(run) == [list(range(1, 41))] * 2, "steps continue from the checkpoint"
    assert run.metrics()["attempt"].max() == 1
    assert checkpoint_steps(run.folder)[-1] == 40
    shown = subprocess.run([*CLI, "show", str(run.folder)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    assert "attempt 0 failed: rank 1" in shown.stdout and "injected failure on rank 1" in shown.stdout
    assert "restart 1/1" in shown.stdout and "resumed from" in shown.stdout
    from workbench.ui.state import read_state

    assert "attempt 0: rank 1" in read_state(run, 100).earlier_failures[0]
    assert_nothing_left(run.folder)


def test_restarts_that_are_spent_fail_the_run_with_every_attempts_failure(tmp_path):
    from tests.support.tasks_for_tests import failing_at

    run = workbench.submit(cfg(tmp_path, max_steps=1000, launch={"max_restarts": 1}),
                           task=functools.partial(failing_at, 5, rank=0, **OPTIONS))
    assert run.wait(timeout=240).state == "failed"
    assert [(f.rank, f.attempt) for f in run.failures()] == [(0, 0), (0, 1)]
    assert run.exception().attempt == 1 and "injected failure on rank 0" in run.exception().traceback
    assert_nothing_left(run.folder)
    assert not run_processes(run.folder)
