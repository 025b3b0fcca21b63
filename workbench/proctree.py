"""The processes of a run, named so that they can be ended from anywhere: by pid, process group and
start time (a pid the kernel has given to another process since is never signalled).

Used by the agents inside the job (they end their worker's process group), the local controller
and the Run handle (``Run.cancel`` from any process, after a kernel restart too).  Processes a run
or pool folder names are signalled only once workbench.launch.ours has found them provably ours.
No imports from the rest of workbench: both sides use it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

KILL_AFTER_S = 5.0
"""A process group asked to stop (SIGTERM) gets this long before SIGKILL."""


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int = 0
    """Start time in clock ticks after boot (/proc/PID/stat field 22); 0 when unknown."""
    pgid: int = 0
    """Its process group (0: not a group of its own that can be signalled as a whole)."""

    @classmethod
    def of(cls, pid: int, group: bool = False) -> Proc | None:
        """The live process `pid` (None if there is none); `group`: end its whole process group too."""
        found = _stat(pid)
        if found is None:
            return None
        return cls(pid, found[2], found[1] if group else 0)

    @classmethod
    def from_dict(cls, data: Any) -> Proc | None:
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            return None
        return cls(int(data["pid"]), int(data.get("start") or 0), int(data.get("pgid") or 0))

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def alive(self) -> bool:
        """Running (not a zombie) and still the same process (same start time)."""
        found = _stat(self.pid)
        return found is not None and found[0] != "Z" and (not self.start or found[2] == self.start)

    def group_alive(self) -> bool:
        """Some process of its group is left (the leader may be gone, its children not)."""
        if self.alive():
            return True
        if not self.pgid:
            return False
        leader = _stat(self.pgid)
        if leader is not None and self.start and leader[2] != self.start:
            return False  # the leader's pid belongs to another process now: the group is gone
        try:
            os.killpg(self.pgid, 0)  # signal 0: asks whether the group has any process, zombies included
        except ProcessLookupError:
            return False  # none at all (a finished worker's group): no need to read every /proc entry
        except PermissionError:
            pass
        return any(found[1] == self.pgid and found[0] != "Z" for found in map(_stat, _pids()) if found)

    def send(self, sig: int) -> None:
        """Signal its group (when it has one of its own) or the process; gone processes are skipped."""
        if self.pgid and self.group_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
        elif self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) from /proc/PID/stat; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2]), int(fields[19])


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    if not pgid:
        return []
    return [pid for pid in _pids() if (found := _stat(pid)) is not None and found[1] == pgid and found[0] != "Z"]


def command_line(pid: int) -> list[str] | None:
    """The process's arguments (/proc/PID/cmdline); None when it is gone or they cannot be read.
    Trailing empty ones are dropped: a process forked warm shows its own arguments in its parent's
    argument area, the rest of it zeroed (workbench.engine.forked)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            data = fh.read().rstrip(b"\0")
    except OSError:
        return None
    return [part.decode(errors="replace") for part in data.split(b"\0")] if data else None


def working_folder(pid: int) -> str | None:
    """The process's working folder; None when it cannot be read (gone, or another user's)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def owner_uid(pid: int) -> int | None:
    """The user the process runs as (its effective uid, the owner of /proc/PID); None when gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def leave_quickly() -> None:
    """Before a process of a run exits normally (an agent, the local controller), once everything it
    writes is written and closed: the interpreter's teardown then skips the cyclic garbage collection
    of what was loaded (gc.freeze), most of its shutdown time (0.32 s of 0.34 s after `import
    submitit`, measured).  Exit codes, atexit handlers and stream flushes are untouched; Run.wait()
    waits for these processes to be gone (bench/run_wait.py)."""
    import gc

    gc.freeze()


def alive(procs: Iterable[Proc]) -> list[Proc]:
    return [p for p in procs if p.group_alive()]


def wait_gone(procs: Iterable[Proc], timeout_s: float, poll_s: float = 0.05) -> list[Proc]:
    """Wait until every process (and group) has ended or `timeout_s` passed; returns those left."""
    left = alive(procs)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(poll_s)
        left = alive(left)
    return left


def end(procs: Iterable[Proc], grace_s: float = KILL_AFTER_S, first: int = signal.SIGTERM) -> list[Proc]:
    """Ask (`first`), wait up to `grace_s`, then SIGKILL whatever is left (a stopped process too);
    returns what is still there after that (normally nothing)."""
    left = alive(procs)
    for proc in left:
        proc.send(first)
    left = wait_gone(left, grace_s)
    for proc in left:
        proc.send(signal.SIGKILL)
    return wait_gone(left, 2.0)


def parent_death_signal(sig: int) -> Callable[[], None]:
    """A Popen preexec_fn that has the kernel send `sig` to the child when its parent ends (Linux
    prctl PR_SET_PDEATHSIG; elsewhere a no-op).  The C function is looked up here, in the parent,
    so the child makes one call between fork and exec."""
    prctl = _prctl()

    def preexec() -> None:
        if prctl is not None:
            prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG; kept across exec

    return preexec


def _prctl() -> Any:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def signal_name(code: int) -> str:
    """"SIGKILL" for a Popen return code of -9 (or a signal number)."""
    try:
        return signal.Signals(abs(code)).name
    except ValueError:
        return f"signal {abs(code)}"
