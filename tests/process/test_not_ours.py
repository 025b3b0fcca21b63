"""A run folder someone else wrote cannot make workbench signal the processes it names (issue 30,
item 1), planted as the trial did: a failed run's folder copied, given to another user, mode 0777,
its run.json and procs/ naming a decoy `sleep 600` in a process group of its own.  Run.load(f).wait(),
Run.cancel(), `workbench cancel f` and `workbench follow f` each leave the decoy alive and say why in
one line.  So does a folder of ours whose recorded pid now belongs to an unrelated process, while a
process of ours that the folder names is still ended."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lifecycle import CLI
from tests.support.runs import write_run
from workbench.errors import NotSignalledWarning
from workbench.launch.run import Run
from workbench.proctree import Proc, command_line
from workbench.runfolder.failures import error_record, write_error
from workbench.runfolder.layout import RunDir, read_json, write_json_atomic

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's folder needs root (chown)")]


def _started(process: subprocess.Popen, word: str) -> subprocess.Popen:
    """`process` once it runs its own program (until exec, a child's command line is its parent's)."""
    deadline = time.monotonic() + 30
    while word not in " ".join(command_line(process.pid) or []):
        assert time.monotonic() < deadline, f"pid {process.pid} did not start {word}"
        time.sleep(0.01)
    return process


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen]:
    """An unrelated process in a process group of its own, ended by PID after the test."""
    sleeper = _started(subprocess.Popen(["sleep", "600"], start_new_session=True), "sleep 600")
    yield sleeper
    os.kill(sleeper.pid, signal.SIGKILL)
    sleeper.wait(timeout=10)


def _failed_run(root: Path, name: str) -> RunDir:
    """A failed local run's folder: its ranks' records, rank 1's error."""
    run = RunDir(write_run(root, name, world=2, rule="none", steps=5, final="failed"))
    write_error(run, 1, error_record(1, "ValueError", "bad batch", "  File \"train.py\", line 3", 0, "node1", 5))
    return run


def _naming(run: RunDir, proc: Proc) -> None:
    """run.json's controller and procs/ name `proc`, as a running local job's would."""
    meta = read_json(run.meta)
    write_json_atomic(run.meta, {**meta, "job_id": str(proc.pid), "controller": proc.to_dict(),
                                 "submit_host": socket.gethostname()})
    for rank in (0, 1):
        write_json_atomic(run.procs(rank), {"rank": rank, "attempt": 0, "agent": proc.to_dict(),
                                            "worker": proc.to_dict()})


def _planted(tmp_path: Path, sleeper: subprocess.Popen) -> RunDir:
    """The trial's folder: a failed run's folder copied, owned by another user, every file mode 0777."""
    original = _failed_run(tmp_path / "mine", "failed-run")
    planted = RunDir(tmp_path / "shared" / "failed-run")
    shutil.copytree(original.root, planted.root)
    _naming(planted, Proc.of(sleeper.pid, group=True))
    other = pwd.getpwnam("nobody").pw_uid
    for folder, _, files in os.walk(planted.root):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(path, other, other)
            os.chmod(path, 0o777)
    return planted


def _alive(sleeper: subprocess.Popen) -> bool:
    time.sleep(0.2)  # a signal, had one been sent, has landed
    return sleeper.poll() is None


def _one_line(caught: list[warnings.WarningMessage], *said: str) -> str:
    lines = [str(w.message) for w in caught if issubclass(w.category, NotSignalledWarning)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    for words in said:
        assert words in lines[0], lines[0]
    return lines[0]


def test_waiting_on_a_planted_folder_signals_nothing_and_says_why(tmp_path, decoy):
    planted = _planted(tmp_path, decoy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = Run.load(planted.root).wait(timeout=60)
    assert status.state == "failed" and _alive(decoy)
    _one_line(caught, f"{planted.root}: not signalled: pid {decoy.pid}",
              "the folder is owned by nobody (uid", "not by you")


def test_cancelling_a_planted_folder_signals_nothing_writes_nothing_and_says_why(tmp_path, decoy):
    planted = _planted(tmp_path, decoy)
    before = planted.meta.read_bytes()
    run = Run.load(planted.root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.cancel()
    assert _alive(decoy) and planted.meta.read_bytes() == before  # not marked cancelled either
    assert run.not_signalled == _one_line(caught, f"pid {decoy.pid}", "owned by nobody")


@pytest.mark.parametrize("command", ["cancel", "follow"])
def test_the_cli_on_a_planted_folder_signals_nothing_and_says_why_in_one_line(tmp_path, decoy, command):
    planted = _planted(tmp_path, decoy)
    done = subprocess.run([*CLI, command, str(planted.root)], capture_output=True, text=True, timeout=90)
    assert _alive(decoy), done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if "not signalled" in line]
    assert len(said) == 1 and said[0].startswith(f"workbench: warning: {planted.root}: not signalled: pid "
                                                 f"{decoy.pid}") and "owned by nobody" in said[0], done.stderr
    assert "Traceback" not in done.stderr and done.returncode == 1  # cancel: not stopped; follow: the run failed


def test_a_pid_of_ours_given_to_an_unrelated_process_is_not_signalled(tmp_path, decoy):
    """Our own private folder; the controller it names is a process that is not a workbench process
    of it, and the workers' pid is now another process (its start time is not the record's)."""
    run = _failed_run(tmp_path, "ours")
    real = Proc.of(decoy.pid, group=True)
    _naming(run, real)
    reused = Proc(real.pid, real.start - 1, real.pgid)
    for rank in (0, 1):
        write_json_atomic(run.procs(rank), {"rank": rank, "attempt": 0, "worker": reused.to_dict()})
    handle = Run.load(run.root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle.cancel()
    assert _alive(decoy)
    line = _one_line(caught, "it is not a workbench process of this folder (it runs: sleep 600)", "(and 1 more)")
    assert handle.not_signalled == line
    from workbench.launch.ours import signallable

    assert signallable(run, ("worker",))[1] == [  # named twice, said once
        f"pid {real.pid} (the worker in procs/rank0.json): that pid is another process now (its start time "
        "is not the record's)"]


def test_a_job_id_alone_names_no_process_we_signal(tmp_path, decoy):
    """run.json's job id is a local job's controller pid, but without its start time it could be
    anyone's: waiting on and cancelling the run leave it alone and say so."""
    run = _failed_run(tmp_path, "ours")
    write_json_atomic(run.meta, {**read_json(run.meta), "job_id": str(decoy.pid), "submit_host": socket.gethostname()})
    handle = Run.load(run.root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert handle.wait(timeout=60).state == "failed"
        handle.cancel()
    assert _alive(decoy) and "cancelled" not in read_json(run.meta)
    assert [str(w.message) for w in caught if w.category is NotSignalledWarning] == [
        f"{run.root}: not signalled: pid {decoy.pid} (the controller in run.json): its record gives no start time, "
        "so the pid cannot be told from another process's"] * 2


def test_a_process_of_ours_that_our_folder_names_is_still_ended(tmp_path):
    """The other side of the check: a private folder of ours naming a live workbench process of it
    (a stand-in whose command line is a worker's of this folder) is cancelled as before."""
    run = _failed_run(tmp_path, "ours")
    stand_in = _started(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "-m",
                                          "workbench.engine.worker", str(run.root)], start_new_session=True),
                        "workbench.engine.worker")
    try:
        _naming(run, Proc.of(stand_in.pid, group=True))
        handle = Run.load(run.root)
        with warnings.catch_warnings():
            warnings.simplefilter("error", NotSignalledWarning)
            handle.cancel()
        assert stand_in.wait(timeout=30) == -signal.SIGTERM and handle.not_signalled == ""
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()


def _blank(seconds: float) -> subprocess.Popen:
    """A process of ours in a group of its own whose command line reads empty, as one caught in its
    exit does (its argument area zeroed), for `seconds`."""
    code = ("from workbench.engine.forked import _show_as; import time; _show_as([]); "
            f"print('blank', flush=True); time.sleep({seconds})")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "blank"
    return process


def test_a_named_process_that_ends_while_it_is_checked_is_neither_signalled_nor_refused(tmp_path):
    """A process caught in its exit no longer shows a command line (a warm-forked controller leaves in a
    moment): gone within the check's half second, it is not a stranger, and no line says it was left
    alone; one that stays is refused as before."""
    from workbench.launch.ours import signallable
    from workbench.launch.run import ROLES

    run = _failed_run(tmp_path, "ours")
    for seconds, expected in ((0.1, 0), (600, 1)):
        process = _blank(seconds)
        try:
            _naming(run, Proc.of(process.pid, group=True))
            ours, refused = signallable(run, ROLES)
            assert (ours, len(refused)) == ([], expected), refused
        finally:
            process.kill()
            process.wait(timeout=30)
