"""Failures named right, 2 real ranks (gloo, CPU, 1 thread each), faults made for real: the process
that died (an agent, the controller), ranks that both raise, a hung rank, a script failing under
`workbench launch`, a full disk.  Each test checks what the user sees (the named rank, the cause and
its user frame, what followed as consequences, exit codes, no workbench frames) and that nothing of
the run is left.  `-s` prints the time from each fault to the user seeing its cause."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import (
    CLI,
    ENDLESS,
    as_from_a_terminal,
    assert_nothing_left,
    cfg,
    report,
    slow_task_cfg,
    wait_for_step,
)
from workbench.runfolder.layout import read_json

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]

FAULTS = SCRIPTS / "faults.py"
ENGINE_FRAMES = ("workbench/engine", "workbench/launch", "submitit", "runpy", "RankFailed")


def _launch(tmp_path: Path, *args: str, extra: tuple[str, ...] = (), **popen) -> subprocess.Popen:
    """`workbench launch --nproc 2 faults.py ARGS` as a user starts it, its own session."""
    command = [*CLI, "launch", "--nproc", "2", "--set", f"launch.run_root={tmp_path / 'runs'}",
               "--set", "dist.threads_per_rank=1", *extra, str(FAULTS), *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def _folder(out: str) -> Path:
    return Path(next(line for line in out.splitlines() if "run folder:" in line).split("run folder:")[1].strip())


def _no_workbench_frames(text: str) -> None:
    shown = [frame for frame in ENGINE_FRAMES if frame in text]
    assert not shown, f"workbench's own frames reached the user ({shown}):\n{text}"


def test_ctrl_c_on_a_script_that_saves_on_sigterm_and_exits_0_is_a_cancel_and_its_last_lines_show(tmp_path):
    """The script's own SIGTERM handler saves and exits 0 (preemption handling): the run was still
    stopped by the user, so it is cancelled, not finished; and what the ranks printed while stopping
    reaches the terminal, not only the rank logs."""
    proc = _launch(tmp_path, "graceful", "x", preexec_fn=as_from_a_terminal)
    seen = []
    while not any("ready" in line for line in seen):
        line = proc.stdout.readline()
        assert line, (seen, proc.stderr.read())
        seen.append(line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    out = "".join(seen) + out
    folder = _folder(out)
    assert proc.returncode == 130, (out, err)
    assert "[rank 0] rank 0 checkpoint saved" in out, out[-2000:]  # rank 0's output is shown by default
    status = workbench.Run.load(folder).status()
    assert status.state == "cancelled", status
    assert "finished" not in out.splitlines()[-1], out[-500:]
    assert_nothing_left(folder)


def test_a_failing_script_under_launch_names_the_rank_at_once_in_its_own_frames(tmp_path):
    proc = _launch(tmp_path, "raise", "1")
    out, err = proc.communicate(timeout=240)
    folder = _folder(out)
    assert proc.returncode == 1, (out, err)
    said = next(line for line in err.splitlines() if line.startswith("[workbench] rank 1 ("))
    assert said.endswith("raised ValueError: injected failure on rank 1") and "attempt 0" in said, err
    assert 'faults.py", line' in err and "in loss_fn" in err, "the user's frame"
    _no_workbench_frames(err)
    assert err.count("Traceback") <= 2, err  # rank 1's own, echoed, and the summary's; no knock-on noise
    run = workbench.Run.load(folder)
    failure = run.exception()
    assert (failure.rank, failure.type, failure.attempt) == (1, "ValueError", 0)
    assert [f.rank for f in run.failures()] == [1], "every view names the same cause"
    raised_at = failure.time
    summary_at = os.stat(folder / "errors" / "rank1.json").st_mtime
    report("script raised under `workbench launch` -> cause on the terminal (error file to exit)",
           time.time() - max(raised_at, summary_at))
    assert_nothing_left(folder)


def test_both_ranks_raising_keep_their_errors_and_one_is_the_cause(tmp_path):
    proc = _launch(tmp_path, "raise", "both")
    out, err = proc.communicate(timeout=240)
    run = workbench.Run.load(_folder(out))
    assert proc.returncode == 1, (out, err)
    failure = run.exception()
    others = [(f.rank, f.type, f.attempt) for f in failure.consequences]
    assert failure.type == "ValueError" and others == [(1 - failure.rank, "ValueError", 0)], failure.summary()
    assert f"injected failure on rank {1 - failure.rank}" in err, "the other rank's error is shown too"
    for rank in (0, 1):
        assert read_json(run.dir.error(rank))["message"] == f"injected failure on rank {rank}"
    assert "errors/rank" not in err, "no pointer to an error file (that may not exist)"
    assert_nothing_left(run.folder)


def test_a_killed_agent_is_the_one_cause_in_every_view(tmp_path):
    """SIGKILL to rank 1's agent: its worker dies with it and rank 0 sees its connection reset; the
    death is the cause everywhere, the reset its consequence."""
    run = workbench.submit(slow_task_cfg(tmp_path, 0.02, **ENDLESS, checkpoint_every_steps=10))
    wait_for_step(run, 5)
    agent = read_json(run.dir.procs(1))["agent"]["pid"]
    os.kill(agent, signal.SIGKILL)
    killed = time.time()
    status = run.wait(timeout=120)
    assert status.state == "failed"
    failure = run.exception()
    report("SIGKILL to rank 1's agent -> named the cause", time.time() - killed)
    assert (failure.rank, failure.type) == (1, "Lost") and "agent" in failure.message and "SIGKILL" in failure.message
    assert [(f.rank, f.type) for f in run.failures()] == [(1, "Lost")]
    assert all(f.rank == 0 for f in failure.consequences)
    shown = subprocess.run([*CLI, "show", str(run.folder)], capture_output=True, text=True, timeout=60)
    assert "rank 1 (" in shown.stderr and "SIGKILL" in shown.stderr, shown.stderr
    assert "attempt 0 failed" not in shown.stdout, "no second cause"
    assert "running" not in [r.state for r in status.ranks]
    assert_nothing_left(run.folder)


def test_a_killed_controller_leaves_its_cause(tmp_path):
    run = workbench.submit(slow_task_cfg(tmp_path, 0.02, **ENDLESS, checkpoint_every_steps=10))
    wait_for_step(run, 5)
    controller = run.meta["controller"]["pid"]
    os.kill(controller, signal.SIGKILL)
    killed = time.time()
    elsewhere = workbench.Run.load(run.folder)  # a handle that did not start it (another process's view)
    assert elsewhere.wait(timeout=120).state == "failed"
    failure = elsewhere.exception()
    report("SIGKILL to the local controller -> named the cause", time.time() - killed)
    assert failure is not None and failure.rank == -1 and "controller" in str(failure), failure
    failure = run.exception()  # the handle that started it knows the signal
    assert "SIGKILL" in failure.message and f"pid {controller}" in failure.message, failure
    assert [f.rank for f in run.failures()] == [-1]
    shown = subprocess.run([*CLI, "show", str(run.folder)], capture_output=True, text=True, timeout=60)
    assert "the local controller" in shown.stderr and "SIGKILL" in shown.stderr, shown.stderr
    assert_nothing_left(run.folder)


def test_an_unflushed_print_reaches_the_terminal_while_the_rank_runs(tmp_path):
    """The rank prints without flush and waits for the test, which waits to see the line."""
    gate = tmp_path / "gate"
    proc = _launch(tmp_path, "print", str(gate))
    started = time.monotonic()
    for line in proc.stdout:  # blocks for ever (the test times out) if the line came only at exit
        if line.strip() == "[rank 0] ready":
            break
    report("unflushed print: seen on the terminal while the rank still runs (from the command's start)",
           time.monotonic() - started)
    gate.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    folder = next((tmp_path / "runs").iterdir())
    logs = workbench.Run.load(folder).logs(0)
    order = [line for line in logs.splitlines() if line.split(" ")[0] in ("out", "err", "ready")]
    assert order == ["out 0", "err 0", "out 1", "err 1", "ready"], logs  # stdout and stderr as written
    assert_nothing_left(folder)


def test_a_hung_rank_is_named_with_its_frame_and_ends_the_run(tmp_path):
    """Rank 1 loops in its loss (its heartbeat thread alive); rank 0 waits in the gradient all-reduce.
    With a 3 s stall limit (dist.on_hang: fail) the run ends at once, long before dist.timeout_s."""
    proc = _launch(tmp_path, "hang", "1", extra=("--set", "dist.stall_after_s=3"))
    out, err = proc.communicate(timeout=240)
    ended = time.time()
    run = workbench.Run.load(_folder(out))
    assert proc.returncode == 1, (out, err)
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "Hung"), failure.summary()
    assert "faults.py:" in failure.where and failure.where.endswith("in loss_fn"), failure.where
    assert "rank 0 waits for it in a collective" in failure.message
    assert "faults.py" in failure.traceback and "loss_fn" in failure.traceback  # its stack, the user's frames
    assert [f.rank for f in failure.consequences] == [0] and failure.consequences[0].knock_on
    assert "waiting for rank 1 in a collective" in failure.consequences[0].message, failure.summary()
    said = next(line for line in err.splitlines() if line.startswith("[workbench] rank 1 ("))
    assert "hung: no progress for" in said and "in loss_fn" in said, err
    assert "then rank 0" in err and "waiting for rank 1" in err
    _no_workbench_frames(err)
    hung = run.events().query("event == 'hung'").iloc[0]
    stuck_since = float(hung["time"]) - float(hung["silent_s"])
    report("rank 1 hung -> `workbench launch` exited naming it, from its last progress (3 s stall limit)",
           ended - stuck_since)
    shown = subprocess.run([*CLI, "show", str(run.folder)], capture_output=True, text=True, timeout=60)
    assert "hung" in shown.stderr and "loss_fn" in shown.stderr
    assert_nothing_left(run.folder)



def test_torchrun_variables_and_the_record_error_file_are_read_into_the_failure(tmp_path):
    script = tmp_path / "recorded.py"
    shutil.copy(SCRIPTS / "recorded.py", script)
    run = workbench.submit_script(script, [], cfg(tmp_path), nproc=2)
    assert run.wait(timeout=180).state == "failed"
    for rank in (0, 1):
        env = json.loads(next(line for line in run.logs(rank, "out").splitlines() if line.startswith("{")))
        assert env["TORCHELASTIC_ERROR_FILE"] == str(run.dir.elastic_error(rank))
        assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "KeyError") and "from a recorded main" in failure.message, failure
    assert "recorded.py" in failure.traceback
    assert_nothing_left(run.folder)


def test_a_meeting_port_taken_before_the_ranks_meet_is_replaced_by_a_fresh_one(tmp_path, monkeypatch):
    """Another process listens on the port the submitter chose (as one may in the seconds before
    rank 0 binds it): rank 0 cannot listen there, every rank meets again on a fresh port."""
    import socket

    import workbench.launch.executors as executors

    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setattr(executors, "free_port", lambda host="127.0.0.1": port)
    try:
        run = workbench.submit(cfg(tmp_path, max_steps=5))
        status = run.wait(timeout=240)
    finally:
        taken.close()
    assert status.state == "finished", run.exception()
    warnings = run.event_summary().warnings
    assert any(f"port {port} was taken before the ranks met" in w for w in warnings), warnings
    assert not run.failures() and not list(run.dir.folder("errors").glob("rank*.json"))
    assert_nothing_left(run.folder)


def test_sigint_stops_a_cli_started_with_sigint_ignored(tmp_path):
    """`workbench launch ... &` in a script: the shell starts it with SIGINT ignored; kill -INT stops it."""
    proc = _launch(tmp_path, "train", "100000", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    folder = _folder(proc.stdout.readline())
    run = workbench.Run.load(folder)
    wait_for_step(run, 3)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, (out, err)
    cancelled_by = workbench.Run.load(folder).meta["cancelled_by"]
    assert cancelled_by == f"SIGINT to the workbench command (pid {proc.pid})", cancelled_by
    assert_nothing_left(folder)


def test_exports_are_private_and_dead_checkpoint_temps_go_at_resume(tmp_path):
    job = cfg(tmp_path, max_steps=10, checkpoint_every_steps=5)
    run = workbench.submit(job)
    assert run.wait(timeout=180).state == "finished", run.exception()
    dead = run.dir.checkpoints / ".step-00000015.pt.tmp-999999"  # a writer killed mid-write
    dead.write_bytes(b"\0" * 1000)
    old = os.umask(0)
    try:
        csv = run.export_metrics(tmp_path / "shared" / "deep" / "m.csv")
        exported = subprocess.run([*CLI, "export", str(run.folder), "--metrics", str(tmp_path / "cli" / "m.csv")],
                                  capture_output=True, text=True, timeout=60)
    finally:
        os.umask(old)
    assert exported.returncode == 0, exported.stderr
    for path in (csv, tmp_path / "cli" / "m.csv"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o700
    resumed = workbench.submit(job.replace(train__max_steps=15), run_dir=run.folder)
    assert resumed.wait(timeout=180).state == "finished", resumed.exception()
    assert not dead.exists(), "the dead writer's temp file is removed at the resume"
    assert resumed.event_summary().resumed_from.endswith("step-00000010.pt")
    assert_nothing_left(run.folder)


def test_a_full_disk_under_the_cli_is_one_line_and_exit_2(tmp_path, small_disk):
    path = tmp_path / "job.yaml"
    cfg(small_disk, task="tests.support.tasks_for_tests:big", max_steps=1000, checkpoint_every_steps=5,
        keep_checkpoints=5).to_yaml(path)
    proc = subprocess.run([*CLI, "run", str(path), "--quiet"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: rank 0 ("), proc.stderr
    assert "disk full" in lines[0] and "checkpoints/step-" in lines[0] and "free some space" in lines[0]
    assert_nothing_left(_folder(proc.stdout))



def test_a_script_that_never_logs_a_step_is_named_hung_after_the_limit_the_user_set(tmp_path):
    """No workbench.log, so no step: the limit before the first step used to be at least 300 s whatever
    `dist.stall_after_s` said (the run was named 302 s after the hang with 20 s set).  The user's number holds,
    from the start: 20 s, so that a rank still importing torch on a loaded machine is not what gets named."""
    proc = _launch(tmp_path, "hang-unlogged", "1", extra=("--set", "dist.stall_after_s=20"))
    out, err = proc.communicate(timeout=150)  # the automatic limit would still be waiting: 300 s
    run = workbench.Run.load(_folder(out))
    failure = run.exception()
    assert proc.returncode == 1 and (failure.rank, failure.type) == (1, "Hung"), failure.summary()
    assert failure.where.endswith("in loss_fn") and "rank 0 waits for it in a collective" in failure.message
    assert "which rank 1 never entered" in failure.message, failure.message  # the flight recorder's collective
    assert "ranks 0:aborted, 1:hung)" in out and "lost" not in out + err, out  # what was named, not "lost"
    assert [r.state for r in run.status().ranks] == ["aborted", "hung"]
    assert_nothing_left(run.folder)


SUBMITTING_FILE = '''
import json, os, sys, time

import workbench
from workbench.engine.builtin_tasks import synthetic_classification


def stuck_task(**options):  # defined in the submitting file, as in a notebook cell: it travels by value
    task = synthetic_classification(**options)
    base, calls = task.loss_fn, {"n": 0}

    def stuck_loss(output, target):
        if task.model.training and os.environ["RANK"] == "1":
            calls["n"] += 1
            if calls["n"] == 8:
                time.sleep(3600)
        return base(output, target)

    task.loss_fn = stuck_loss
    return task


cfg = workbench.JobConfig.from_dict({
    "task": {"options": {"n_train": 2048, "n_val": 64}},
    "train": {"micro_batch_size": 16, "max_steps": 5000, "checkpoint_every_steps": None},
    "dist": {"procs_per_node": 2, "threads_per_rank": 1, "stall_after_s": 3, "timeout_s": 600,
             "measure_comm": sys.argv[2] == "on"},
    "launch": {"run_root": sys.argv[1]},
})
run = workbench.submit(cfg, task=stuck_task)
status = run.wait(timeout=150)
failure = run.exception()
print(json.dumps({"folder": str(run.folder), "state": status.state, "rank": failure and failure.rank,
                  "type": failure and failure.type, "where": failure and failure.where,
                  "message": failure and failure.message}))
'''


@pytest.mark.parametrize("comm_timing", ["on", "off"])
def test_a_factory_from_the_submitting_file_names_its_hung_rank_on_the_default_engine_path(tmp_path, comm_timing):
    """`workbench.submit(cfg, task=factory)`, the default path: with comm timing on (the default) rank 0 waits in
    the engine's own comm hook, which by file looked like workbench code, so the hung rank was never named and
    the run failed minutes later at dist.timeout_s blaming rank 0.  Off, DDP's reducer waits (torch's files)."""
    script = tmp_path / "submit_it.py"
    script.write_text(SUBMITTING_FILE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "runs"), comm_timing], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["state"] == "failed" and (said["rank"], said["type"]) == (1, "Hung"), said  # long before timeout_s
    assert "submit_it.py:" in said["where"] and said["where"].endswith("in stuck_loss"), said
    assert "rank 0 waits for it in a collective (all_reduce #" in said["message"], said
    assert "which rank 1 never entered" in said["message"], said  # the flight recorder's collective, either hook
    assert_nothing_left(Path(said["folder"]))


def sizes_that_differ():
    """submit_fn: at step 6 rank 0 sums 3 numbers and rank 1 five, in the same all_reduce: gloo aborts a rank
    in native code (its C++ enforce, "Is there a distributed collective mismatch in your code?"), where NCCL
    would hang (that case is the flight recorder's: test_hang_shapes)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import workbench

    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    for step in range(1, 10**6):
        model(torch.randn(8, 4)).sum().backward()
        workbench.log(step=step, loss=float(step))
        if step == 6:
            dist.all_reduce(torch.ones(3 if rank == 0 else 5))  # the sizes differ: a bug in the user's code


def test_collectives_of_different_sizes_are_named_with_gloos_words_and_the_users_line(tmp_path):
    """Which rank gloo aborts depends on which one receives first; that one is the cause, named with what gloo
    said and the user's line (from the Python stacks faulthandler printed), not only "killed by SIGABRT"."""
    run = workbench.submit_fn(sizes_that_differ, cfg=cfg(tmp_path, dist={"stall_after_s": 60, "timeout_s": 600}))
    assert run.wait(timeout=200).state == "failed"
    failure = run.exception()
    assert failure.type == "Lost" and "killed by SIGABRT in native code" in failure.message, failure.summary()
    assert "collective mismatch in your code" in failure.message, failure.message
    assert "test_failure_causes.py:" in failure.message and "in sizes_that_differ" in failure.message, failure
    assert_nothing_left(run.folder)
