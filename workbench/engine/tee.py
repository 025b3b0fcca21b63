"""A worker's stdout and stderr as its agent passes them on (runs in the agent, inside a rank).

The worker writes into two pipes; one thread per pipe copies each chunk, as it comes, to the
stream's destination, and each complete line to the rank's interleaved log (logs/rank{R}.log)
under one lock, so that `Run.logs(rank)` shows stdout and stderr in the order they were written.
A pipe is always drained, whatever fails: a full disk never blocks the worker.

- A cold run's worker (engine.agent): the destinations are the agent's own streams (the rank's
  log files the scheduler made: what `workbench launch` echoes and `Run.logs(rank, "out"|"err")`
  reads) and logs/rank{R}.log, for the worker's whole life.
- A warm pool's worker (engine.pool_agent) runs one job after another: before and after each job
  it writes a route mark into both streams (`switch_output`, called in the worker), and each
  pipe's thread sends what follows the mark where the mark says (that job's run-folder logs),
  then back to the agent's own streams.  The mark travels in the stream itself, so every byte
  lands on the side of the switch it was written on.  It carries a token the agent made
  (TEE_MARK_ENV): a job's own output cannot switch anything."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from workbench.engine.forked import Forked
from workbench.runfolder.private import open_private

CHUNK = 1 << 16
DRAIN_S = 2.0
"""After the worker ended, how long its pipes are read on (a child of its may hold them open)."""
TEE_MARK_ENV = "WORKBENCH_TEE_MARK"
"""The token of a warm worker's route marks, set by its agent."""
_MARK = b"\x1eworkbench-route:"


def new_mark() -> str:
    """A fresh token for one worker's route marks."""
    return secrets.token_hex(8)


class Tee:
    """Copy the worker's pipes: each chunk to its stream's destination, each line to `both`
    (None: nowhere until a route mark names a file).  `mark`: the token of route marks to obey."""

    def __init__(self, worker: subprocess.Popen[bytes] | Forked, both: Path | None, mark: str | None = None):
        self.lock = threading.Lock()
        self.mark = _MARK + mark.encode() + b":" if mark else None
        self.streams = [_Stream(self, fd, both) for pipe, fd in ((worker.stdout, 1), (worker.stderr, 2))
                        if pipe is not None]
        self.pipes = [p for p in (worker.stdout, worker.stderr) if p is not None]
        self.threads = [threading.Thread(target=self._copy, args=(pipe, stream), daemon=True,
                                         name=f"workbench-tee-{stream.fd}")
                        for pipe, stream in zip(self.pipes, self.streams, strict=True)]
        for thread in self.threads:
            thread.start()

    def _copy(self, pipe: IO[bytes], stream: _Stream) -> None:
        pending, source = b"", pipe.fileno()
        while True:
            try:
                chunk = os.read(source, CHUNK)
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending = self._feed(stream, pending + chunk)
        stream.write(pending)
        stream.end_line()

    def _feed(self, stream: _Stream, data: bytes) -> bytes:
        """Pass `data` on, obeying the route marks in it; what may be the start of a mark is kept
        for the next chunk (returned)."""
        while self.mark is not None:
            at = data.find(self.mark)
            if at < 0:
                keep = _mark_start(data, self.mark)
                stream.write(data[:len(data) - keep])
                return data[len(data) - keep:]
            end = data.find(b"\n", at)
            if end < 0:
                stream.write(data[:at])
                return data[at:]  # a mark is one write: the rest of it is on its way
            stream.write(data[:at])
            with contextlib.suppress(ValueError):
                stream.route(json.loads(data[at + len(self.mark):end]))
            data = data[end + 1:]
        stream.write(data)
        return b""

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait (a little) for the pipes to be read to their end."""
        for thread in self.threads:
            thread.join(timeout)

    def close(self) -> None:
        """Close the pipes and the logs once read to their end (a pipe a child of the worker still
        holds is left to its thread)."""
        self.drain()
        if any(thread.is_alive() for thread in self.threads):
            return
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.close()
        for stream in self.streams:
            stream.close()


class _Stream:
    """One pipe's destinations: a file descriptor for its chunks, a file for its lines."""

    def __init__(self, tee: Tee, fd: int, both: Path | None):
        self.tee, self.fd = tee, fd
        self.default_both = both
        self.out = fd
        self.out_file: IO[Any] | None = None
        self.both: IO[Any] | None = None
        self.partial = b""
        self._open_both(both)

    def write(self, data: bytes) -> None:
        if not data:
            return
        _write_all(self.out, data)
        lines, _, self.partial = (self.partial + data).rpartition(b"\n")
        if lines:
            self._line(lines + b"\n")

    def route(self, where: dict[str, Any]) -> None:
        """Switch to the files a route mark names ({"out": ..., "err": ..., "both": ...}), or back
        to the agent's own stream ({})."""
        self.close()
        target = where.get("out" if self.fd == 1 else "err")
        if target:
            with contextlib.suppress(OSError):
                self.out_file = open_private(Path(target), "ab")
                self.out = self.out_file.fileno()
        self._open_both(where.get("both") if target else self.default_both)

    def end_line(self) -> None:
        """A last line without its newline is a line all the same."""
        if self.partial:
            self._line(self.partial + b"\n")
            self.partial = b""

    def close(self) -> None:
        self.end_line()
        if self.out_file is not None:
            with contextlib.suppress(OSError):
                self.out_file.close()
        self.out, self.out_file = self.fd, None
        with self.tee.lock, contextlib.suppress(OSError):
            if self.both is not None:
                self.both.close()
        self.both = None

    def _open_both(self, path: str | Path | None) -> None:
        self.both = None
        if path:
            with contextlib.suppress(OSError):
                self.both = open_private(Path(path), "ab")

    def _line(self, data: bytes) -> None:
        with self.tee.lock:
            if self.both is not None:
                try:
                    self.both.write(data)
                    self.both.flush()
                except OSError:
                    self.both = None  # a full disk: the rank's own log files still get everything


def switch_output(where: dict[str, str]) -> None:
    """In a warm worker: what it writes from now on goes where `where` says (see Tee.route), {}
    for back to its agent's streams.  Flushes Python's buffers first: their bytes were written
    before the switch."""
    token = os.environ.get(TEE_MARK_ENV)
    if not token:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    mark = _MARK + token.encode() + b":" + json.dumps(where).encode() + b"\n"
    for fd in (1, 2):
        _write_all(fd, mark)


def _mark_start(data: bytes, mark: bytes) -> int:
    """How many bytes at the end of `data` could begin a mark (kept until the next chunk)."""
    if b"\x1e" not in data[-len(mark):]:
        return 0
    for keep in range(min(len(mark) - 1, len(data)), 0, -1):
        if mark.startswith(data[-keep:]):
            return keep
    return 0


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a full disk, a closed stream: the pipe is drained all the same
        while data:
            data = data[os.write(fd, data):]
