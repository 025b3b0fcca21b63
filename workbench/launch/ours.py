"""Signal only what is provably ours.  A run or pool folder names processes (run.json's or
pool.json's controller, procs/rank{R}.json's agent and worker), and Run.cancel, Run.wait's clean-up
of survivors, `workbench cancel` / `follow`, a pool's close and the local controller end them.  A
folder can be another user's copy, writable by anyone, naming any process group; a recorded pid
can belong to another process since.  So before any signal (`why_not_ours`, the one check):

- the folder, every folder down to the record, and the record are the current user's and
  writable by no one else (the record a regular file, not a link): runfolder.private.why_not_private,
  the one owner of "is this folder ours" (the pickle readers ask it too);
- the process is the one the record names (the same start time, /proc/PID/stat field 22), runs as
  the current user, and is a workbench process of this folder: `python -m` one of RUN_MODULES with
  an argument inside the folder (the run or pool folder, or its logs/).  A process group whose
  leader is gone counts when every member left runs as the user and one of them is such a process.

What fails the check is left alone, and one NotSignalledWarning line says why."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from workbench.errors import NotSignalledWarning
from workbench.proctree import Proc, command_line, group_members, owner_uid, working_folder
from workbench.runfolder.layout import RunDir
from workbench.runfolder.private import shown_in, user_name, why_not_private

RUN_MODULES = ("workbench.launch.local_controller", "submitit.core._submit", "workbench.engine.worker",
               "workbench.engine.warm")
"""The modules a run's or pool's processes run as: the local controller, submitit's task (a rank's
agent), a cold worker, a warm pool's worker."""


def why_not_ours(folder: Path, record: Path, proc: Proc) -> str:
    """"" when `proc`, named by `record` in the run or pool `folder`, may be signalled; else why not
    (a phrase)."""
    return why_not_private(folder, record) or _same_process(folder, proc)


def signallable(run: RunDir, roles: Sequence[str]) -> tuple[list[Proc], list[str]]:
    """The live processes of `roles` ("controller", "agent", "worker") that `run` names and that
    pass why_not_ours, and why each other live one does not ("pid N (the worker in procs/rank0.json): why")."""
    ours, refused, seen = [], [], set()
    for role in roles:
        for record, proc in run.named(role):
            if proc in seen or (not proc.group_alive() and not _pid_reused(proc)):
                continue  # named twice, or gone: nothing to signal, nothing to say
            seen.add(proc)
            why = why_not_ours(run.root, record, proc)
            if why and command_line(proc.pid) is None and _ended_meanwhile(proc):
                continue  # it was exiting (its command line went with its memory): nothing to signal
            if why:
                refused.append(f"pid {proc.pid} (the {role} in {shown_in(run.root, record)}): {why}")
            else:
                ours.append(proc)
    return ours, refused


def say_not_signalled(folder: Path, refused: list[str]) -> str:
    """One NotSignalledWarning line for the processes left alone; returns it ("" for none)."""
    if not refused:
        return ""
    more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
    line = f"{folder}: not signalled: {refused[0]}{more}"
    warnings.warn(line, NotSignalledWarning, stacklevel=3)
    return line


def _same_process(folder: Path, proc: Proc) -> str:
    """"" when the process (or, its leader gone, its group) is the workbench process the record names."""
    if not proc.start:
        return "its record gives no start time, so the pid cannot be told from another process's"
    if _pid_reused(proc):
        return "that pid is another process now (its start time is not the record's)"
    members = [proc.pid] if proc.alive() else group_members(proc.pgid)
    if not members:
        return ""  # gone meanwhile
    strangers = [pid for pid in members if owner_uid(pid) not in (os.geteuid(), None)]
    if strangers:
        return f"pid {strangers[0]} runs as {user_name(owner_uid(strangers[0]))}, not as you"
    if not any(is_run_command(command_line(pid), working_folder(pid), folder) for pid in members):
        shown = " ".join(command_line(members[0]) or ["?"])[:120]
        return f"it is not a workbench process of this folder (it runs: {shown})"
    return ""


def is_run_command(argv: Sequence[str] | None, cwd: str | None, folder: Path) -> bool:
    """Whether a command line is one of a run's processes for `folder`: `-m` one of RUN_MODULES,
    and an argument naming the folder or a path inside it (relative ones from `cwd`)."""
    if not argv or not any(a == "-m" and b in RUN_MODULES for a, b in zip(argv, argv[1:])):
        return False
    root = os.path.realpath(folder)
    for arg in argv[1:]:
        if not arg or arg.startswith("-") or (not os.path.isabs(arg) and cwd is None):
            continue
        path = os.path.realpath(os.path.join(cwd or "/", arg))
        if path == root or path.startswith(root + os.sep):
            return True
    return False


def _ended_meanwhile(proc: Proc, within_s: float = 0.5) -> bool:
    """The process (and its group) is gone now, or within `within_s`: one caught in its exit, whose
    /proc entry no longer shows a command line, is not refused as a stranger."""
    deadline = time.monotonic() + within_s
    while proc.group_alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _pid_reused(proc: Proc) -> bool:
    """The recorded pid runs, but as another process than the record's (another start time)."""
    found = Proc.of(proc.pid)
    return found is not None and bool(proc.start) and found.start != proc.start


def unrecorded_controller(run: RunDir) -> Proc | None:
    """The local controller of this run folder that its submitter started but did not live to record
    (killed between the start and run.json's job id): the user's own `python -m
    workbench.launch.local_controller <run>/logs`.  Asked only of a folder whose run.json names no job."""
    from workbench.proctree import _pids

    for pid in _pids():
        argv = command_line(pid) if owner_uid(pid) == os.geteuid() else None
        if not argv or "workbench.launch.local_controller" not in argv:
            continue
        proc = Proc.of(pid, group=True)
        if proc is not None and is_run_command(argv, working_folder(pid), run.root):
            return proc
    return None
