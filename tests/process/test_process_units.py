"""Pieces the lifecycle relies on, on real processes: ending a process group by recorded pid (a
stopped leader, a recycled pid), the error file written from the reserve on a full disk,
provenance, a cold worker's exit, a factory's error showing the user's frames."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.fixtures import tmpfs
from tests.support.runs import fail_building, frame_lines
from tests.support.tasks_for_tests import raising_inside
from workbench.engine.userframes import HIDDEN_NOTE
from workbench.proctree import Proc, end
from workbench.runfolder.failures import reserve_error_space, write_error
from workbench.runfolder.layout import RunDir, read_json
from workbench.runfolder.provenance import dist_env, submit_provenance

pytestmark = pytest.mark.timeout(60)


def test_ending_a_group_kills_a_stopped_leader_and_its_children(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print('started', flush=True); time.sleep(60)"], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline() == "started\n"  # its child exists before the leader is stopped
    proc = Proc.of(parent.pid, group=True)
    parent.send_signal(signal.SIGSTOP)  # a stopped process ignores SIGTERM until SIGKILL
    assert proc.group_alive()
    assert end([proc], grace_s=0.5) == []
    parent.wait(timeout=5)
    parent.stdout.close()
    assert not proc.group_alive()



def test_a_recycled_pid_is_never_signalled():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        real = Proc.of(sleeper.pid)
        impostor = Proc(real.pid, real.start + 1)  # same pid, another start time: someone else
        assert real.alive() and not impostor.alive()
        impostor.send(signal.SIGKILL)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()



def test_an_error_file_is_written_on_a_full_disk_from_the_reserve(tmp_path):
    with tmpfs(tmp_path / "tiny", "512k") as mount:
        run = RunDir(mount / "run").create()
        reserve_error_space(run, 1)
        with open(mount / "filler", "wb") as fh, pytest.raises(OSError):
            fh.write(b"x" * 10**6)
            fh.flush()
        write_error(run, 1, {"rank": 1, "type": "OSError", "message": "disk full", "traceback": "tb" * 100})
        assert read_json(run.error(1))["message"] == "disk full"
        assert run.ranks_with("errors") == [1]



def test_provenance_names_the_submitter_and_the_distributed_environment(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("UNRELATED", "x")
    facts = submit_provenance()
    assert facts["python"] == sys.version.split()[0] and facts["torch"]
    assert facts["dist_env"]["NCCL_SOCKET_IFNAME"] == "eth0" and "UNRELATED" not in facts["dist_env"]
    assert "command" in facts["submitted_by"]
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/train.ipynb")
    assert submit_provenance()["submitted_by"]["notebook"] == "/home/me/train.ipynb"
    assert dist_env({"MASTER_PORT": "1", "CUDA_VISIBLE_DEVICES": "0"}) == {"CUDA_VISIBLE_DEVICES": "0",
                                                                          "MASTER_PORT": "1"}


def test_the_environment_record_keeps_names_and_redacts_values_that_look_like_secrets():
    """run.json is read by whoever can read a shared run root (issue 30 item 10): a secret kept
    under a MASTER_/NCCL_/OMP_ name is named, its value not."""
    settings = {"MASTER_ADDR": "node-17.cluster.example.org", "MASTER_PORT": "29500", "NCCL_DEBUG": "WARN",
                "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1", "NCCL_DEBUG_FILE": "/scratch/me/nccl.%h.%p",
                "OMP_NUM_THREADS": "4", "OMP_PLACES": "{0:4},{4:4}"}
    secrets = {"MASTER_TOKEN": "abc", "NCCL_PASSWORD": "hunter2", "OMP_SECRET_KEY": "x",
               "NCCL_EXTRA": "sk-Ab3dEf9hIjKlMnOpQr5tUv", "MASTER_NOTE": "two words; $(rm -rf)"}
    found = dist_env({**settings, **secrets, "HOME": "/root"})
    assert set(found) == set(settings) | set(secrets)
    assert {k: found[k] for k in secrets} == dict.fromkeys(secrets, "<redacted>")
    assert {k: found[k] for k in settings} == settings


def test_exit_now_keeps_buffered_output_and_the_code_and_skips_teardown(tmp_path):
    """A cold engine worker leaves with worker.exit_now: what it printed (buffered, to a file or a
    pipe) and logged is kept, the exit status is the one given, and nothing of the interpreter's
    teardown runs (where a native thread's destructor once aborted a finished rank)."""
    import subprocess
    import sys

    log = tmp_path / "rank.log"
    code = ("import atexit, logging, sys\n"
            f"logging.basicConfig(filename={str(log)!r}, level=logging.INFO)\n"
            "logging.info('logged before the exit')\n"
            "atexit.register(lambda: print('teardown ran'))\n"
            "sys.stdout.write('printed, still in the buffer'); sys.stderr.write('to stderr')\n"
            "from workbench.engine.worker import exit_now\n"
            "exit_now(76)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": ""})
    assert done.returncode == 76
    assert done.stdout == "printed, still in the buffer" and done.stderr == "to stderr"
    assert "logged before the exit" in log.read_text()








def test_an_error_in_the_factory_shows_the_users_frames(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
    text = fail_building(tmp_path, raising_inside).exception().traceback
    frames = frame_lines(text)
    assert "tests/support/tasks_for_tests.py" in frames[-1] and "raising_inside" in frames[-1]
    assert not any("/workbench/" in f for f in frames)
    assert text.splitlines()[-2] == "KeyError: 'hiden'" and text.endswith(HIDDEN_NOTE)

