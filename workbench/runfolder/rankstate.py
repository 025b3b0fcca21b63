"""The states a rank reports, and what its silence means: one definition for the ranks that write
their status (``engine.monitor``) and everything that reads it (``launch.status``, the dashboard's
badges, the CLI).

A rank rewrites its status file every ``HEARTBEAT_S`` seconds.  Seen from outside, a rank that says
it is starting or running but has not written for ``SILENT_AFTER_S`` (or half the lost limit, if
that is shorter) is *silent* (frozen, or its node is slow to answer: a warning); after the run's
``dist.lost_after_s`` (60 s unless set) it is *lost*: its neighbour in the ring of heartbeat
watchers writes an error file for it and the run stops, and a reader that sees the same age calls
it lost too (``liveness``, given the same ``dist.lost_after_s``), so both sides give one answer
with one message (``lost_message``).  Whoever calls a rank lost from the rank's own node also says
whether its process is still there (``process_there``): a live process that stopped beating was
stopped (SIGSTOP) or hung with all its threads; a gone one was killed.  No imports beyond the
standard library and ``workbench.proctree`` (which has none): the engine and the notebook side both
use it."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from workbench.proctree import Proc

HEARTBEAT_S = 2.0
SILENT_AFTER_S = 30.0

RANK_STATES: dict[str, str] = {
    "pending": "not started yet: the scheduler has not run it, or it is importing",
    "starting": "the process runs: building the process group and the task",
    "running": "training",
    "finished": "trained to the end",
    "failed": "raised an exception (its traceback is in errors/)",
    "aborted": "stopped itself because another rank failed",
    "interrupted": "stopped by a signal (cancel)",
    "requeued": "checkpointed after a preemption or time-limit signal; waits for the scheduler to restart it",
    "restarting": "its attempt failed (launch.max_restarts): waits for every rank to start again from the "
                  "latest checkpoint",
    "lost": "no heartbeat, no word: stopped (SIGSTOP) or frozen with all its threads, killed by a signal, out of "
            "memory, or its node failed",
    "hung": "named hung: it made no progress for the stall limit while the others waited for it in a collective "
            "(dist.stall_after_s); then stopped",
}
"""Every state a rank can be in, with what it means."""

ACTIVE = ("starting", "running")
"""States of a rank whose process should be alive and beating."""
ENDED_RANK_STATES = ("finished", "failed", "aborted", "interrupted", "lost", "hung")
"""A rank in one of these states will write nothing more in this job (requeued and restarting ranks will)."""


def liveness(state: str, heartbeat_age_s: float | None, lost_after_s: float) -> str:
    """"alive", "silent" or "lost" for a rank in an ACTIVE state; "" for any other state.
    `lost_after_s` is the run's dist.lost_after_s (the ranks' watcher uses the same)."""
    if state not in ACTIVE or heartbeat_age_s is None:
        return ""
    if is_lost(heartbeat_age_s, lost_after_s, state):
        return "lost"
    return "silent" if heartbeat_age_s > min(SILENT_AFTER_S, lost_after_s / 2) else "alive"


STARTING_LOST_S = 60.0
"""A rank still starting (importing torch, building its task, DDP's set-up: seconds of C code that
can hold the GIL, far longer on a loaded machine) is lost only after at least this long."""


def is_lost(heartbeat_age_s: float, lost_after_s: float, state: str = "running") -> bool:
    """The lost rule: no heartbeat for longer than the run's dist.lost_after_s (at least
    STARTING_LOST_S while the rank is starting)."""
    limit = max(lost_after_s, STARTING_LOST_S) if state == "starting" else lost_after_s
    return heartbeat_age_s > limit


def node_name() -> str:
    """The node a process runs on: SLURM's node name (several may share a host), else the hostname.
    A rank's status says its node; a process id means something only on that node."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def process_there(record: Mapping[str, Any] | None) -> bool | None:
    """Whether the process a rank's status record names (`pid`, `pid_start`, `host`) still exists:
    None when that cannot be told from here (another node, no pid).  A zombie, or a pid the kernel
    has given to another process since (another start time), is gone."""
    if not record or not isinstance(record.get("pid"), int) or record.get("host") != node_name():
        return None
    start = record.get("pid_start")
    return Proc(int(record["pid"]), start if isinstance(start, int) else 0).alive()


def lost_message(rank: int, silent_s: float | None = None, noticed_by: int | None = None,
                 there: bool | None = None) -> str:
    """Why a rank is called lost: one sentence, the same from the ranks' watcher and from a reader.
    `there`: whether its process still exists (process_there; None: not known from where it was seen).
    A process still there stopped answering (stopped, e.g. by SIGSTOP, or hung); a gone one was killed."""
    who = f"; noticed by rank {noticed_by}" if noticed_by is not None else ""
    heard = f"no heartbeat for {silent_s:.0f} s" if silent_s is not None else "ended without reporting"
    if there:
        return (f"rank {rank} stopped answering: {heard}, its process still there "
                f"(stopped, e.g. by SIGSTOP, or hung with all its threads){who}")
    how = f"sent {heard}" if silent_s is not None else heard
    if there is False:
        return f"rank {rank} {how} and its process is gone (killed by a signal, or out of memory){who}"
    return (f"rank {rank} {how} (stopped answering: stopped or hung; or killed by a signal, out of memory, "
            f"or its node failed){who}")


def killed_message(rank: int, signal_name: str) -> str:
    """Why a rank whose process was seen to die from a signal is lost (said by its agent)."""
    why = {"SIGKILL": "killed by hand, by the scheduler, or out of memory",
           "SIGSEGV": "a crash in native code; its Python stacks are in its log",
           "SIGABRT": "aborted by native code; its Python stacks are in its log",
           "SIGBUS": "a bad memory access (a file it mapped shrank, or the disk is full)"}.get(signal_name, "")
    return f"rank {rank}'s process was killed by {signal_name}" + (f" ({why})" if why else "")
