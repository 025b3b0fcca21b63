"""How a rank's failure is written down and described: one wording for the rank itself (its error
file), its agent (a worker that died without one), and every reader (``Run.exception``).

A full disk is named as such with the path being written, whichever layer raised it (torch's zip
writer wraps the OSError in a RuntimeError).  An error file can still be written on a full disk:
each rank keeps a small reserved file that is filled in place and renamed into place."""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.runfolder import records
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.private import open_private, write_atomic

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RESERVE_BYTES = 64 * 1024
_TRACEBACK = "Traceback (most recent call last):"


def disk_full_cause(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError behind `exc` (itself, its cause or its context), if any."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def disk_full_error(path: str | os.PathLike[str], cause: OSError) -> OSError:
    """An OSError that says "disk full" and names the file that could not be written."""
    what = "quota exceeded" if cause.errno == errno.EDQUOT else "no space left on device"
    return OSError(cause.errno, f"disk full ({what}) writing {os.fspath(path)}", os.fspath(path))


def port_taken(exc: BaseException | None) -> bool:
    """Rank 0 could not listen on the meeting port: another process took it (EADDRINUSE), itself,
    its cause or its context (torch's DistNetworkError says it in words)."""
    seen = 0
    while exc is not None and seen < 10:
        if (isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE) or "EADDRINUSE" in str(exc) \
                or "address already in use" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def describe(exc: BaseException) -> tuple[str, str]:
    """(type, message) of an exception as users see it; a full disk says so, with the path."""
    full = disk_full_cause(exc)
    if full is not None:
        message = full.strerror or str(full)
        if "disk full" not in message:
            message = f"disk full ({message})" + (f" writing {full.filename}" if full.filename else "")
        return type(full).__name__, message
    return type(exc).__name__, str(exc)


def last_traceback(text: str) -> tuple[str, str, str] | None:
    """(type, message, traceback text) of the last Python traceback printed in `text` (a rank's
    stderr), or None when there is none."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    lines = text[start:].splitlines()
    for i, line in enumerate(lines[1:], 1):
        if line and not line[0].isspace():  # the first unindented line after the frames
            kind, _, message = line.partition(":")
            if re.fullmatch(r"[\w.]+", kind.strip()):
                return kind.strip().rsplit(".", 1)[-1], message.strip(), "\n".join(lines[: i + 1]) + "\n"
    return None


_NATIVE = re.compile(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.+)")
_FAULT_FRAME = re.compile(r'^\s*File "(.+)", line (\d+) in (\S+)\s*$')


def native_crash(text: str, is_users: Callable[[str], bool]) -> tuple[str, str]:
    """(what native code said, the innermost frame of the user's code) from a rank's stderr after a crash in
    native code, "" where absent: C++'s "terminate called after throwing an instance of 'T' / what(): ..."
    (gloo's "Received data size doesn't match expected size. Is there a distributed collective mismatch in
    your code?", say) and the Python stacks faulthandler printed ("Fatal Python error"), most recent call
    first in each thread, read thread by thread (the crashing thread first) for a frame in the user's code."""
    found = list(_NATIVE.finditer(text))
    what = f"{found[-1].group(1)}: {found[-1].group(2).strip()}" if found else ""
    start = text.rfind("Fatal Python error:")
    threads: list[list[str]] = []
    for line in text[start:].splitlines() if start >= 0 else []:
        if line.startswith(("Current thread 0x", "Thread 0x")):
            threads.insert(0 if line.startswith("Current") else len(threads), [])
            current = threads[0] if line.startswith("Current") else threads[-1]
        elif threads and (frame := _FAULT_FRAME.match(line)) and is_users(frame.group(1)):
            current.append(f"{frame.group(1)}:{frame.group(2)} in {frame.group(3)}")
    where = next((frames[0] for frames in threads if frames), "")
    return what[:2000], where


def reserve_error_space(run: RunDir, rank: int) -> None:
    """Set aside room for this rank's error file while there is some (see write_error)."""
    path = run.error_reserve(rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.stat().st_size < RESERVE_BYTES:
            write_atomic(path, b" " * RESERVE_BYTES)
    except OSError:
        pass  # already full: write_error tries the normal way


def write_error(run: RunDir, rank: int, record: dict[str, Any]) -> None:
    """Write errors/rank{R}.json atomically; on a full disk, into the reserved file (JSON padded with
    spaces, which a JSON reader ignores), renamed into place."""
    import json

    try:
        write_json_atomic(run.error(rank), record)
        return
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS or not run.error_reserve(rank).exists():
            raise
    data = json.dumps(record, default=str).encode()
    if len(data) > RESERVE_BYTES:  # keep the end of the traceback, where the error is
        record = {**record, "traceback": "...\n" + str(record.get("traceback", ""))[-RESERVE_BYTES // 2:]}
        data = json.dumps(record, default=str).encode()[:RESERVE_BYTES]
    reserve = run.error_reserve(rank)
    with open_private(reserve, "r+b") as fh:  # the reserve itself, not what a link there names
        fh.write(data + b" " * (RESERVE_BYTES - len(data)))
    os.replace(reserve, run.error(rank))


def error_record(rank: int, kind: str, message: str, traceback: str, attempt: int, host: str = "",
                 step: int | None = None, **extra: Any) -> dict[str, Any]:
    """The fields of an error file (one schema for the rank, its agent and its ring neighbour)."""
    return {"rank": rank, "type": kind, "message": message, "traceback": traceback, "time": time.time(),
            "step": step, "host": host, "attempt": attempt, **extra}


def elastic_error(path: Path) -> tuple[str, str, str] | None:
    """(type, message, traceback) from the error file torch's @record wrote (TORCHELASTIC_ERROR_FILE:
    {"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": ...}}}), or None."""
    found = records.read_object(path)
    detail = found.get("message") if found else None
    if not isinstance(detail, dict) or not isinstance(detail.get("message"), str):
        return None
    kind, _, message = detail["message"].partition(": ")
    extra = detail.get("extraInfo")
    text = extra.get("py_callstack") if isinstance(extra, dict) else ""
    return kind.strip() or "Error", message.strip(), text if isinstance(text, str) else ""


def controller_error(run: RunDir) -> Path:
    """The record of a run's controller that died (errors/controller.json): written by whoever saw
    it first (an agent whose parent it was, or the process that started it)."""
    return run.controller_error


def write_controller_failure(run: RunDir, message: str, job_id: str, reported_by: str, attempt: int = 0,
                             **extra: Any) -> None:
    """Record that the controller of job `job_id` died (kept if someone recorded it already)."""
    path = controller_error(run)
    found = records.read_object(path, records.ERROR)
    if found is not None and found.get("job_id") == job_id and ("exit_code" in found or "exit_code" not in extra):
        return  # said already (the process that started the controller adds how it ended: its signal)
    write_json_atomic(path, {**error_record(-1, "ControllerLost", message, "", attempt, reported_by=reported_by),
                             "job_id": job_id, **extra})


def controller_failure(run: RunDir, job_id: str) -> dict[str, Any] | None:
    """The controller's death record of job `job_id` (a record of an earlier job in the folder is not)."""
    found = records.read_object(controller_error(run), records.ERROR)
    return found if found is not None and str(found.get("job_id")) == str(job_id) else None
