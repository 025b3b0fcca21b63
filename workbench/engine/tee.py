"""A worker's stdout and stderr as its agent passes them on (runs in the agent, inside a rank).

The worker writes into two pipes; one thread per pipe copies each chunk, as it comes, to the
agent's own stream (the rank's log file the scheduler made: what `workbench launch` echoes and
`Run.logs(rank, "out"|"err")` reads), and each complete line to the rank's interleaved log
(logs/rank{R}.log) under one lock, so that `Run.logs(rank)` shows stdout and stderr in the order
they were written.  A pipe is always drained, whatever fails: a full disk never blocks the worker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from workbench.runfolder.private import open_private

CHUNK = 1 << 16
DRAIN_S = 2.0
"""After the worker ended, how long its pipes are read on (a child of its may hold them open)."""


class Tee:
    def __init__(self, worker: subprocess.Popen[bytes], both: Path):
        self.lock = threading.Lock()
        self.both: IO[Any] | None = None
        with contextlib.suppress(OSError):
            self.both = open_private(both, "ab")
        self.threads = [threading.Thread(target=self._copy, args=(pipe, fd), daemon=True, name=f"workbench-tee-{fd}")
                        for pipe, fd in ((worker.stdout, 1), (worker.stderr, 2)) if pipe is not None]
        self.pipes = [p for p in (worker.stdout, worker.stderr) if p is not None]
        for thread in self.threads:
            thread.start()

    def _copy(self, pipe: IO[bytes], fd: int) -> None:
        partial, source = b"", pipe.fileno()
        while True:
            try:
                chunk = os.read(source, CHUNK)
            except OSError:
                chunk = b""
            if not chunk:
                break
            _write_all(fd, chunk)
            lines, _, partial = (partial + chunk).rpartition(b"\n")
            if lines:
                self._line(lines + b"\n")
        if partial:
            self._line(partial + b"\n")

    def _line(self, data: bytes) -> None:
        with self.lock:
            if self.both is not None:
                try:
                    self.both.write(data)
                    self.both.flush()
                except OSError:
                    self.both = None  # a full disk: the rank's own log files still get everything

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait (a little) for the pipes to be read to their end."""
        for thread in self.threads:
            thread.join(timeout)

    def close(self) -> None:
        """Close the pipes and the interleaved log once read to their end (a pipe a child of the
        worker still holds is left to its thread)."""
        self.drain()
        if any(thread.is_alive() for thread in self.threads):
            return
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.close()
        with self.lock, contextlib.suppress(OSError):
            if self.both is not None:
                self.both.close()
                self.both = None


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a full disk, a closed stream: the pipe is drained all the same
        while data:
            data = data[os.write(fd, data):]
