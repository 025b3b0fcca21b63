"""The one check before a signal to a process a run or pool folder names (workbench.launch.ours,
issue 30 item 1): the folder and the record are the user's own and private, and the process is
the workbench process of that folder the record names.  Pure: the folders are made here, the
processes are this test's own (no process is started, none is signalled)."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import pytest

from workbench.launch.ours import is_run_command, signallable, why_not_ours
from workbench.proctree import Proc
from workbench.runfolder.layout import RunDir, write_json_atomic

pytestmark = pytest.mark.timeout(60)
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _folder(tmp_path: Path) -> tuple[RunDir, Path]:
    run = RunDir(tmp_path / "run").create()
    write_json_atomic(run.meta, {"executor": "local", "world_size": 1})
    write_json_atomic(run.procs(0), {"rank": 0, "worker": {"pid": 1, "start": 1, "pgid": 0}})
    return run, run.procs(0)


def _me() -> Proc:
    found = Proc.of(os.getpid())
    assert found is not None
    return found


def _as_worker(folder: Path) -> list[str]:
    return [sys.executable, "-m", "workbench.engine.worker", str(folder)]


def test_a_private_folder_of_ours_and_the_workbench_process_it_names_pass(tmp_path, monkeypatch):
    run, record = _folder(tmp_path)
    monkeypatch.setattr("workbench.launch.ours.command_line", lambda pid: _as_worker(run.root))
    assert why_not_ours(run.root, record, _me()) == ""
    assert why_not_ours(run.root, run.meta, _me()) == ""


@pytest.mark.parametrize("where, mode, said", [
    ("", 0o777, "the folder is writable by others (mode 0777)"),
    ("procs", 0o770, "procs is writable by its group (mode 0770)"),
    ("procs/rank0.json", 0o666, "procs/rank0.json is writable by others (mode 0666)")])
def test_a_folder_or_record_others_can_write_names_nothing_we_signal(tmp_path, monkeypatch, where, mode, said):
    run, record = _folder(tmp_path)
    monkeypatch.setattr("workbench.launch.ours.command_line", lambda pid: _as_worker(run.root))
    os.chmod(run.root / where, mode)
    assert why_not_ours(run.root, record, _me()) == said


@ROOT_ONLY
@pytest.mark.parametrize("where", ["", "procs", "procs/rank0.json"])
def test_a_folder_or_record_another_user_owns_names_nothing_we_signal(tmp_path, monkeypatch, where):
    other = pwd.getpwnam("nobody").pw_uid
    run, record = _folder(tmp_path)
    monkeypatch.setattr("workbench.launch.ours.command_line", lambda pid: _as_worker(run.root))
    os.chown(run.root / where, other, other)
    shown = where or "the folder"
    assert why_not_ours(run.root, record, _me()) == \
        f"{shown} is owned by nobody (uid {other}), not by you (root (uid 0))"


def test_a_record_that_is_a_link_names_nothing_we_signal(tmp_path, monkeypatch):
    run, record = _folder(tmp_path)
    monkeypatch.setattr("workbench.launch.ours.command_line", lambda pid: _as_worker(run.root))
    elsewhere = tmp_path / "elsewhere.json"
    record.rename(elsewhere)
    record.symlink_to(elsewhere)
    assert why_not_ours(run.root, record, _me()) == "procs/rank0.json is not a regular file"


def test_a_pid_given_to_another_process_or_recorded_without_a_start_time_is_not_signalled(tmp_path, monkeypatch):
    run, record = _folder(tmp_path)
    monkeypatch.setattr("workbench.launch.ours.command_line", lambda pid: _as_worker(run.root))
    me = _me()
    assert why_not_ours(run.root, record, Proc(me.pid, me.start + 1)) == \
        "that pid is another process now (its start time is not the record's)"
    assert why_not_ours(run.root, record, Proc(me.pid)).startswith("its record gives no start time")


def test_a_process_that_is_not_a_workbench_process_of_the_folder_is_not_signalled(tmp_path):
    run, record = _folder(tmp_path)
    assert why_not_ours(run.root, record, _me()).startswith(
        "it is not a workbench process of this folder (it runs: ")  # this test's own pytest


def test_a_run_command_runs_a_workbench_module_on_this_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    python = sys.executable
    assert is_run_command([python, "-m", "workbench.engine.worker", str(folder)], "/", folder)
    assert is_run_command([python, "-u", "-m", "submitit.core._submit", str(folder / "logs")], "/", folder)
    assert is_run_command([python, "-m", "workbench.launch.local_controller", "run/logs"], str(tmp_path), folder)
    assert is_run_command([python, "-m", "workbench.engine.warm", str(folder)], "/", folder)
    assert not is_run_command([python, "-m", "workbench.engine.worker", str(tmp_path / "run2")], "/", folder)
    assert not is_run_command([python, "-m", "workbench.engine.worker", "run"], "/elsewhere", folder)
    assert not is_run_command(["sleep", "600", str(folder)], "/", folder)
    assert not is_run_command([python, "-m", "http.server", str(folder)], "/", folder)
    assert not is_run_command([python, "-m", "workbench.engine.worker", "run"], None, folder)  # cwd unknown
    assert not is_run_command(None, "/", folder) and not is_run_command([], "/", folder)


def test_signallable_skips_the_gone_and_names_each_process_left_alone(tmp_path):
    run, record = _folder(tmp_path)
    me = _me()
    write_json_atomic(run.procs(0), {"rank": 0, "agent": {"pid": 2**22 + 7, "start": 5, "pgid": 0},  # no such pid
                                     "worker": me.to_dict()})
    ours, refused = signallable(run, ("controller", "agent", "worker"))
    assert ours == [] and len(refused) == 1
    assert refused[0].startswith(f"pid {me.pid} (the worker in procs/rank0.json): it is not a workbench process")
