"""Where a rank's DataLoader worker is stuck: the frame in the worker process, read from the rank.

A rank whose main thread waits for its DataLoader's next batch shows torch's queue wait, not the
user's `__getitem__` that never returns: that runs in a worker process.  At start each rank registers
faulthandler on DUMP_SIGNAL with an unlinked temporary file (`arm`); a DataLoader worker forked after
that inherits both.  Once the rank is stuck, its heartbeat finds the worker processes of the iterator
its main thread waits on (forked ones only: a spawned worker has no handler, and the signal would end
it), signals them one at a time and reads each one's stack back from the shared file."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable
from types import FrameType
from typing import IO

DUMP_SIGNAL = signal.SIGRTMIN + 6
"""A real-time signal nothing else here uses (SLURM's preemption signal is SIGUSR2)."""
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')
_dumps: IO[bytes] | None = None


def arm() -> None:
    """Register the dump handler once per process (a warm pool's worker serves many jobs)."""
    global _dumps
    if _dumps is None:
        _dumps = tempfile.TemporaryFile()  # noqa: SIM115 - open for the process's life: workers write into it
        faulthandler.register(DUMP_SIGNAL, file=_dumps, all_threads=True, chain=False)


def loader_workers(frame: FrameType | None) -> list[int]:
    """Pids of the forked workers of the DataLoader iterator the main thread waits on, innermost first."""
    while frame is not None:
        it = frame.f_locals.get("self") if frame.f_code.co_name in ("_get_data", "_try_get_data") else None
        if type(it).__name__ == "_MultiProcessingDataLoaderIter":
            workers = getattr(it, "_workers", [])
            return [p.pid for p in workers if _forked(p) and p.pid]
        frame = frame.f_back
    return []


def _forked(process: object) -> bool:
    """Started by fork (what its popen object says): it inherited the handler."""
    return type(getattr(process, "_popen", None)).__module__ == "multiprocessing.popen_fork"


def stuck_worker(frame: FrameType | None, is_users: Callable[[str], bool],
                 wait_s: float = 2.0) -> tuple[int, str] | None:
    """(pid, "data.py:12 in __getitem__") of the first worker whose stack has a frame of the user's code."""
    if _dumps is None:
        return None
    for pid in loader_workers(frame):
        text = _dump(_dumps.fileno(), pid, wait_s)
        for match in map(_FRAME.match, text.splitlines()):  # faulthandler writes the innermost call first
            if match and is_users(match["file"]):
                return pid, f"{match['file']}:{match['line']} in {match['func']}"
    return None


def _dump(fd: int, pid: int, wait_s: float) -> str:
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:  # gone already
        return ""
    deadline, size = time.monotonic() + wait_s, start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = os.fstat(fd).st_size
        if now > start and now == size:
            break  # it wrote, and stopped writing
        size = now
    with contextlib.suppress(OSError):
        return os.pread(fd, os.fstat(fd).st_size - start, start).decode(errors="replace")
    return ""
