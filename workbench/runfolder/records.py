"""What a record read back from a run folder must look like, and what happens to bytes that are not one.

Run folders live on shared filesystems and outlive crashes, so every reader assumes hostile content:
NUL runs left by a crashed node, half lines, invalid UTF-8, ``42`` or ``null`` where a record
belongs, fields of the wrong type, lines of megabytes, JSON nested a million deep.  The rule:

- A **line** of a JSONL stream (metrics, events) is one record or nothing.  A line longer than
  `MAX_LINE_BYTES`, one that is not UTF-8, not JSON, or not a JSON object is *damaged*: it is
  skipped, counted, and reported in a `DamagedFileWarning` naming the file and the line.  NUL bytes
  around a record (a crashed writer's hole, then the next attempt's record) are stripped first.
- A **record** needs its identity fields (`Schema.required`: `rank` and `step` whole numbers for
  metrics; `event` as text and `rank` for events; `type`, `message` as text and `rank` for errors)
  and, when present, `time` as a finite number; without them it is dropped as a whole (damaged).
  Any other field of the wrong type is dropped from the record and the rest kept: known fields have
  a type (`loss` a number, `host` text, ...); other fields keep JSON scalars only (events also keep
  flat lists).  Whole numbers must fit in 64 bits, text must be valid Unicode; control characters
  in text are shown escaped (no terminal escapes).
- A **single JSON file** (status, error, summary, run.json; at most `MAX_FILE_BYTES`) must hold one
  JSON object; anything else reads as absent, with one warning.

Parsing costs time and memory linear in the bytes read: lines are capped, and deep nesting stops at
Python's recursion limit (RecursionError is caught).  No imports beyond the standard library: the
ranks and the notebook use the same rule.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import DamagedFileWarning
from workbench.runfolder.private import read_bounded

MAX_LINE_BYTES = 1 << 20
"""A JSONL line longer than this is damaged (the engine writes lines of a few hundred bytes)."""
MAX_FILE_BYTES = 8 << 20
"""A status, error, summary or run.json file larger than this reads as absent."""
_INT64 = 1 << 63
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


# --- field checks: value -> (ok, cleaned value) --------------------------------------------------
Check = Callable[[Any], "tuple[bool, Any]"]


def _whole(value: Any) -> tuple[bool, Any]:
    return type(value) is int and -_INT64 <= value < _INT64, value


def _number(value: Any) -> tuple[bool, Any]:
    return type(value) is float or (type(value) is int and -_INT64 <= value < _INT64), value


def _finite(value: Any) -> tuple[bool, Any]:
    return _number(value)[0] and math.isfinite(value), value


def _flag(value: Any) -> tuple[bool, Any]:
    return type(value) is bool, value


def _text(value: Any) -> tuple[bool, Any]:
    if type(value) is not str:
        return False, None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): it would break every print
        return False, None
    return True, _CONTROL.sub(lambda m: repr(m.group())[1:-1], value) if _CONTROL.search(value) else value


def _rank(value: Any) -> tuple[bool, Any]:
    return type(value) is int and 0 <= value < 1 << 31, value


def _rank_or_controller(value: Any) -> tuple[bool, Any]:
    """A rank, or -1: the controller's own error record (errors/controller.json)."""
    return type(value) is int and -1 <= value < 1 << 31, value


def _optional(check: Check) -> Check:
    return lambda value: (True, None) if value is None else check(value)


def _whole_list(value: Any) -> tuple[bool, Any]:
    ok = type(value) is list and all(_whole(v)[0] for v in value)
    return ok, value


def _scalar(value: Any) -> tuple[bool, Any]:
    if value is None or type(value) is bool:
        return True, value
    if type(value) is str:
        return _text(value)
    return _number(value)


def _flat(value: Any) -> tuple[bool, Any]:
    if type(value) is not list:
        return _scalar(value)
    cleaned = [_scalar(v) for v in value]
    return all(ok for ok, _ in cleaned), [v for _, v in cleaned]


def _anything(value: Any) -> tuple[bool, Any]:
    return True, value


@dataclass(frozen=True)
class Schema:
    """The fields a kind of record must have (`required`), the types of the fields it may have
    (`typed`), and what other fields may hold (`others`)."""

    name: str
    required: dict[str, Check] = field(default_factory=dict)
    typed: dict[str, Check] = field(default_factory=dict)
    others: Check = _scalar
    strict: tuple[str, ...] = ("time",)
    """Typed fields that, when present with the wrong type, drop the whole record."""


_TIMED = {"time": _finite}
METRIC = Schema(
    "metrics record", {"rank": _rank, "step": _whole},
    {**_TIMED, "epoch": _whole, "attempt": _whole, **{k: _number for k in (
        "loss", "loss_reduced", "lr", "samples_per_s", "step_time_s", "data_time_s", "comm_wait_s",
        "comm_busy_s", "mem_mb")}})
EVENT = Schema(
    "event", {"event": _text, "rank": _rank},
    {**_TIMED, "step": _whole, "attempt": _whole, "epoch": _whole, "world_size": _whole, "effective_batch": _whole,
     "warmup_steps": _whole, "steps_per_epoch": _whole, "total_steps": _whole, "lr": _number,
     "device": _text, "message": _text, "peak_mb": _optional(_number),
     "in_sync": _flag, "ok": _flag, "first_diverged": _optional(_text),
     "diverged_ranks": _whole_list, "failed_ranks": _whole_list, "nonfinite_ranks": _whole_list,
     "failures": _anything},  # a restart's cause: the failed attempt's error records
    others=_flat)
STATUS = Schema(
    "status", {"state": _text, "time": _finite},
    {"rank": _rank, "step": _whole, "pid": _whole, "pid_start": _whole, "host": _text, "attempt": _whole,
     "stalled": _flag, "stalled_since": _finite, "waiting": _flag, "where": _text, "stuck_s": _finite,
     "hung": _flag, "in_sync": _optional(_flag), "output_lines": _whole,
     "collective": _text, "collective_seq": _whole, "collective_sizes": _text, "collective_done": _flag})
ERROR = Schema(
    "error", {"type": _text, "message": _text, "rank": _rank_or_controller},
    {"traceback": _text, "traceback_full": _text, "time": _finite, "step": _optional(_whole), "host": _text,
     "attempt": _whole}, strict=("time", "attempt"))
"""Every writer (workbench.runfolder.failures.error_record) gives type, message and rank: a file
without them (`{"type": 5}`) is damaged, not a failure with no name."""
SUMMARY = Schema("summary", {}, {"steps": _optional(_whole), "total_steps": _whole, "status": _text,
                                 "world_size": _whole, "stop_reason": _text}, others=_anything, strict=())
META = Schema(
    "run.json", {},
    {"executor": _text, "world_size": _whole, "nodes": _whole, "procs_per_node": _whole, "created": _finite,
     "cancelled": _finite, "user": _text, "submit_host": _text},
    others=_anything, strict=())
"""run.json keeps fields it does not know whatever their type: it is rewritten, and must not lose them."""
ANY_OBJECT = Schema("JSON object", others=_anything, strict=())


def clean_text(value: str) -> str | None:
    """Text as a record keeps it (control characters shown escaped), or None if it is not valid Unicode."""
    ok, cleaned = _text(value)
    return cleaned if ok else None


def whole_fields(schema: Schema) -> set[str]:
    """The fields of `schema` that must be whole numbers (rank, step, epoch, attempt for metrics)."""
    checks = {**schema.required, **schema.typed}
    return {name for name, check in checks.items() if check in (_whole, _rank)}


def clean(obj: Any, schema: Schema) -> tuple[dict[str, Any] | None, str]:
    """The record `obj` as the schema accepts it (wrong-typed fields dropped), or (None, why)."""
    if type(obj) is not dict:
        return None, f"not a JSON object: {reprlib.repr(obj)}"
    for key, check in schema.required.items():
        if key not in obj:
            return None, f"no {key!r} field"
        ok, value = check(obj[key])
        if not ok:
            return None, f"{key!r} is {reprlib.repr(obj[key])}"
        obj[key] = value
    for key in list(obj):
        if key in schema.required:
            continue
        ok, value = schema.typed.get(key, schema.others)(obj[key])
        if ok and (key in schema.typed or _text(key) == (True, key)):
            obj[key] = value
        elif key in schema.strict:
            return None, f"{key!r} is {reprlib.repr(obj[key])}"
        else:
            del obj[key]
    return obj, ""


def parse_line(line: bytes, schema: Schema, max_bytes: int = MAX_LINE_BYTES) -> tuple[dict[str, Any] | None, str]:
    """One JSONL line -> (record, "") or (None, why it is damaged); never raises."""
    if len(line) > max_bytes:
        return None, f"a line of {len(line)} bytes (more than {max_bytes})"
    return parse_json(line, schema)


_DECODER = json.JSONDecoder()


def parse_json(data: bytes, schema: Schema) -> tuple[dict[str, Any] | None, str]:
    """One JSON value in `data` (NULs and blanks around it ignored), cleaned by `schema`; never raises."""
    stripped = data.strip(b" \t\r\n\0")
    if not stripped:
        return None, "only NUL bytes (left by a crashed writer)" if b"\0" in data else "empty"
    try:
        text = stripped.decode("utf-8")
        obj, end = _DECODER.raw_decode(text)
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    except RecursionError:
        return None, "JSON nested too deeply"
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return None, f"not JSON ({str(exc)[:80]})"
    if end != len(text):
        return None, "not JSON (more after the first value)"
    return clean(obj, schema)


def read_object(path: str | Path, schema: Schema = ANY_OBJECT) -> dict[str, Any] | None:
    """A file holding one JSON object, cleaned by `schema`; None if it is absent or is not one
    (warned once per file version).  Never raises for what the file holds."""
    path = Path(path)
    try:
        data = read_bounded(path, MAX_FILE_BYTES + 1)  # a regular file only: a FIFO there is not waited on
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # a folder in its place, no permission: unreadable is absent, with a word
        warn_damaged(path, [(0, f"unreadable: {exc.strerror}")], once_key=(str(path), exc.errno))
        return None
    if len(data) > MAX_FILE_BYTES:
        record, why = None, f"larger than {MAX_FILE_BYTES >> 20} MiB"
    else:
        record, why = parse_json(data, schema) if data.strip() else (None, "empty")
    if record is None:
        warn_damaged(path, [(0, why)], once_key=_version(path))
    return record


def _version(path: Path) -> tuple[Any, ...]:
    try:
        st = path.stat()
    except OSError:
        return (str(path),)
    return (str(path), st.st_mtime_ns, st.st_size, st.st_ino)


_WARNED: OrderedDict[tuple[Any, ...], None] = OrderedDict()


def warn_damaged(path: Path, damaged: list[tuple[int, str]], once_key: tuple[Any, ...] | None = None) -> None:
    """One DamagedFileWarning for the damaged lines found in `path` by one read: [(line, why)],
    line 0 meaning the whole file.  With `once_key`, the same key (a file version) is warned about
    once per process: a status file re-read every poll is named once."""
    if not damaged:
        return
    if once_key is not None:
        if once_key in _WARNED:
            return
        _WARNED[once_key] = None
        if len(_WARNED) > 4096:
            _WARNED.popitem(last=False)
    line, why = damaged[0]
    if not line:  # the whole file
        text = f"{path}: {why}; read as if it were absent"
    else:
        more = f" and {len(damaged) - 1} more damaged line(s)" if len(damaged) > 1 else ""
        text = f"{path}: skipped line {line} ({why}){more}; the other lines are read"
    warnings.warn(text, DamagedFileWarning, stacklevel=3)


NOT_SCALARS = {"rank", "step", "epoch", "time", "attempt"}
"""Record fields that are not metrics (they index them)."""


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's metrics: numeric fields other than rank, step, epoch, time, attempt (NaN dropped)."""
    out = {}
    for key, value in record.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value == value:
            out[key] = float(value)
    return out
