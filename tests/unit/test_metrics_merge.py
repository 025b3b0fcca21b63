"""Every logged value kept: `run.metrics()` is the fold of every record on disk, whatever was written.

Records of one rank at one step merge (the union of their fields, a field's last value winning); an
attempt that logs a step again replaces the earlier attempts' records of that step; damaged lines are
skipped by the line rule of workbench.runfolder.records.  The property test writes arbitrary
interleavings of fields, steps, attempts, half-written lines and damaged lines through the real
JsonlWriter and raw appends, polls as a live dashboard does, and compares what the reader holds
(the columnar fast path, its fallbacks, the incremental per-rank rows) with a plain fold of the files'
lines written here."""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import JobConfig
from workbench.errors import DamagedFileWarning
from workbench.launch.run import Run
from workbench.runfolder import records
from workbench.runfolder.layout import RunDir
from workbench.runfolder.reader import MetricTail, RankFrames
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(300)
EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "80"))
DERIVED = {"wall_time", "elapsed_s", "samples"}
SMALL = {"MAX_LINE_BYTES": 300, "CHUNK_BYTES": 1000, "SUB_BLOCK_BYTES": 200, "COLUMNAR_MIN_BYTES": 0}
"""Tail sizes that make a few records cross chunk, piece and line-length limits."""

DAMAGED = [
    b"not json", b"42", b"null", b"[1, 2]", b"\0\0\0", b"\xff\xfe", b'{"rank": 0}', b'{"step": 3}',
    b'{"rank": 0, "step": 1.5}', b'{"rank": -1, "step": 1}', b'{"rank": 0, "step": 2, "time": NaN}',
    b'{"rank": 0, "step": 2, "time": null}', b'{"rank": 0, "step": 1}{"rank": 0, "step": 2}',
    b'{"rank": 0, "step": 2} {"rank": 0, "step": 3}', b'{"rank": 0, "step": -NaN}', b"\xef\xbb\xbf{}",
    b'{"rank": 0, "step": 18446744073709551616}', b'{"rank": true, "step": 1}',
]
"""Lines that are no record (the line rule skips and names them)."""
ODD = [
    b"", b"   ", b"\t\r", b'{"rank": 0, "step": 3, "loss": "x"}', b'{"rank": 0, "step": 3, "loss": null}',
    b'{"rank": 0, "step": 4, "loss": 1.0, "loss": 2.0}', b'{"rank": 0, "step": 4, "lo\\u0073s": 3.0}',
    b'{"rank": 0, "step": 2, "big": 18446744073709551616}', b'{"rank": 0, "step": 2, "x": -Infinity}',
    b'{"rank": 0, "step": 5, "attempt": 1, "x": [1, 2]}', b'{"rank": 0, "step": 5, "x": {"a": 1}}',
    b'{"rank": 0, "step": 6, "note": "1.2345678901234567e-301"}', b'{"rank": 0, "step": 6, "y": 1e400}',
    b'{"rank": 0, "step": 7, "bad\\u0001key": 1}', b'{"rank": 0, "step": 7, "w": 1.2345678901234567e-301}',
    b' {"rank": 0, "step": 8, "loss": 0.5}', b'{"rank": 0, "step": 8, "loss": 0.25}\r', b'\0{"rank": 0, "step": 9}',
]
"""Lines that are records, or blank, in ways a columnar reader gets wrong (duplicate keys, escapes,
nulls, whole numbers past 64 bits, sentinel look-alikes, NUL padding)."""

VALUES = st.one_of(st.floats(), st.integers(-(2 ** 70), 2 ** 70), st.booleans(), st.text(max_size=4), st.none())
FIELDS = st.dictionaries(st.sampled_from(["loss", "lr", "train_loss", "note", "count", "comm_wait_s", "epoch",
                                          "time", "attempt"]), VALUES, max_size=4)
RECORD = st.fixed_dictionaries({"rank": st.sampled_from([0, 0, 0, 1]), "step": st.integers(0, 8)},
                               optional={"attempt": st.integers(0, 2)}).flatmap(
    lambda base: FIELDS.map(lambda fields: {**fields, **base}))


@st.composite
def _events(draw: st.DrawFn) -> list[tuple]:
    events = []
    for _ in range(draw(st.integers(1, 25))):
        rank = draw(st.integers(0, 2))
        kind = draw(st.sampled_from(["write", "write", "write", "burst", "half", "rest", "damaged", "odd", "poll"]))
        if kind == "write":
            events.append(("write", rank, draw(st.lists(RECORD, min_size=1, max_size=4))))
        elif kind == "burst":  # many records of one shape: the columnar path, with a new key late
            first, count = draw(st.integers(0, 20)), draw(st.integers(1, 160))
            events.append(("burst", rank, first, count, draw(st.integers(0, 2)), draw(st.booleans())))
        elif kind == "half":
            events.append(("half", rank, draw(RECORD), draw(st.floats(0.1, 0.9))))
        elif kind in ("damaged", "odd"):
            line = draw(st.one_of(st.sampled_from(DAMAGED if kind == "damaged" else ODD),
                                  st.binary(max_size=40).filter(lambda b: b"\n" not in b),
                                  st.integers(250, 400).map(lambda n: b'{"rank": 0, "step": 1, "s": "' + b"x" * n
                                                            + b'"}')))
            events.append(("raw", rank, line))
        else:
            events.append((kind, rank))
    return events


def _burst(first: int, count: int, attempt: int, late_key: bool, rank: int) -> list[dict]:
    out = []
    for i in range(count):
        record = {"rank": rank, "step": first + i, "time": 1000.0 + i, "loss": 1.0 / (i + 1), "lr": 0.1,
                  "comm_wait_s": math.nan if i % 3 else 0.01 * i, "attempt": attempt}
        if late_key and i >= 120:
            record["val_loss"] = 0.5
        out.append(record)
    return out


# --- the reference: the files' complete lines, the line rule, a plain fold ------------------------
def _reference_lines(path: Path, max_bytes: int) -> list[tuple[int, dict | None]]:
    """(line number, record or None if damaged) for every complete non-blank line of the file."""
    data = path.read_bytes() if path.exists() else b""
    lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
    out = []
    for number, line in enumerate(lines, start=1):
        if line.strip(b" \t\r"):
            record, _ = records.parse_line(line, records.METRIC, max_bytes)
            out.append((number, record))
    return out


def _fold(found: list[dict]) -> list[dict]:
    """Per step, the records of the highest attempt that logged it, merged in the order written."""
    by_step: dict[int, tuple[int, dict]] = {}
    for record in found:
        attempt, step = record.get("attempt", 0), record["step"]
        held = by_step.get(step)
        if held is None or attempt > held[0]:
            by_step[step] = (attempt, dict(record))
        elif attempt == held[0]:
            held[1].update(record)
    return [row for _, (_, row) in sorted(by_step.items())]


def _reference(folder: Path, max_bytes: int) -> dict[int, list[dict]]:
    out = {}
    for rank in range(3):
        found = [r for _, r in _reference_lines(folder / f"rank{rank}.jsonl", max_bytes) if r is not None]
        if found:
            out[rank] = _fold(found)
    return out


# --- comparing ----------------------------------------------------------------------------------
def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (bool, np.bool_)) or isinstance(b, (bool, np.bool_)):
        return isinstance(a, (bool, np.bool_)) and isinstance(b, (bool, np.bool_)) and bool(a) == bool(b)
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return float(a) == float(b)


def _rows(frame: pd.DataFrame) -> list[dict]:
    columns = [c for c in frame.columns if c not in DERIVED]
    return [{k: v for k, v in row.items() if not _missing(v)} for row in frame[columns].to_dict("records")]


def _assert_rows(got: list[dict], want: list[dict], where: str) -> None:
    want = [{k: v for k, v in row.items() if not _missing(v)} for row in want]
    assert len(got) == len(want), f"{where}: {len(got)} rows, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys() and all(_same(g[k], w[k]) for k in w), f"{where} row {i}: {g} != {w}"


def _columns(rows: list[dict]) -> set[str]:
    return {key for row in rows for key in row}


def _check(run: Run, folder: Path, max_bytes: int) -> None:
    want = _reference(folder, max_bytes)
    everything = sorted((row for rows in want.values() for row in rows), key=lambda r: r["step"])
    everything = [r for _, r in sorted(enumerate(everything), key=lambda ir: (ir[1]["step"], ir[1]["rank"], ir[0]))]
    frame = run.metrics()
    assert set(frame.columns) - DERIVED == _columns(everything)
    _assert_rows(_rows(frame), everything, "run.metrics()")
    frames = run.metric_frames
    assert sorted(frames.frames) == sorted(want)
    for rank, rows in want.items():
        _assert_rows(_rows(frames.frames[rank]), rows, f"rank {rank}'s rows")
        assert frames.columns(("step",))[rank]["step"].tolist() == [r["step"] for r in rows]


def _run_folder(path: Path) -> RunDir:
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 3}, "launch": {"run_root": str(path.parent)}})
    return RunDir(path).prepare(cfg, "local")


def _play(events: list[tuple], run_dir: RunDir, run: Run, max_bytes: int) -> None:
    folder = run_dir.folder("metrics")
    pending: dict[int, bytes] = {}
    for event in events:
        kind, rank = event[0], event[1]
        path = run_dir.metrics(rank)
        if kind in ("write", "burst"):
            writer = JsonlWriter(path)  # starts on a fresh line if a half line is there (a crashed writer)
            pending.pop(rank, None)
            for record in (event[2] if kind == "write" else _burst(*event[2:], rank=rank)):
                writer.write(record)
            writer.close()
        elif kind == "half":
            line = (json.dumps(event[2]) + "\n").encode()
            cut = max(1, int(len(line) * event[3]))
            _append(path, line[:cut])
            pending[rank] = line[cut:]
        elif kind == "rest" and rank in pending:
            _append(path, pending.pop(rank))
        elif kind == "raw":
            _append(path, event[2] + b"\n")
            pending.pop(rank, None)
        elif kind == "poll":
            _check(run, folder, max_bytes)
    for rank, rest in pending.items():
        _append(run_dir.metrics(rank), rest)


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fh.write(data)


def _named_lines(caught: list[warnings.WarningMessage]) -> set[tuple[str, int]]:
    out = set()
    for w in caught:
        found = re.search(r"(rank\d+)\.jsonl: skipped line (\d+)", str(w.message))
        if found:
            out.add((found.group(1), int(found.group(2))))
    return out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(events=_events(), small=st.booleans())
def test_metrics_are_the_plain_fold_of_every_line_whatever_was_written(tmp_path_factory, events, small):
    root = tmp_path_factory.mktemp("runs")
    run_dir = _run_folder(root / "run")
    sizes = SMALL if small else {"COLUMNAR_MIN_BYTES": 0}  # every block tries the columnar path
    max_bytes = sizes.get("MAX_LINE_BYTES", records.MAX_LINE_BYTES)
    with mock.patch.multiple(MetricTail, **sizes), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DamagedFileWarning)
        live = Run(run_dir.root)  # one handle polled as the dashboard polls it
        _play(events, run_dir, live, max_bytes)
        _check(live, run_dir.folder("metrics"), max_bytes)
        cold = Run(run_dir.root)  # and a fresh handle reading every file at once
        _check(cold, run_dir.folder("metrics"), max_bytes)
    damaged = {(f"rank{rank}", number) for rank in range(3)
               for number, record in _reference_lines(run_dir.metrics(rank), max_bytes) if record is None}
    assert cold.metric_frames.skipped == len(damaged)
    assert _named_lines(caught) <= damaged  # every line named in a warning is a damaged line, by its number


def test_a_script_logging_loss_then_lr_at_one_step_keeps_both(tmp_path):
    run_dir = _run_folder(tmp_path / "run")
    writer = JsonlWriter(run_dir.metrics(0))
    for step in range(1, 4):
        writer.write({"rank": 0, "step": step, "time": 1000.0 + step, "loss": 1.0 / step})
        writer.write({"rank": 0, "step": step, "time": 1000.5 + step, "lr": 0.1 * step})
    writer.close()
    frame = Run(run_dir.root).metrics()
    assert frame["step"].tolist() == [1, 2, 3]
    assert frame["loss"].tolist() == [1.0, 0.5, 1 / 3] and frame["lr"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert frame["time"].tolist() == [1001.5, 1002.5, 1003.5]  # logged twice: the last value


def test_a_resumed_attempt_replaces_the_steps_it_trained_again_without_merging(tmp_path):
    run_dir = _run_folder(tmp_path / "run")
    writer = JsonlWriter(run_dir.metrics(0))
    for step in (1, 2, 3, 4):
        writer.write({"rank": 0, "step": step, "loss": 1.0, "grad_norm": 9.0, "attempt": 0})
    for step in (3, 4, 5):  # resumed from the checkpoint at step 2
        writer.write({"rank": 0, "step": step, "loss": 2.0, "attempt": 1})
    writer.close()
    frame = Run(run_dir.root).metrics()
    assert frame["step"].tolist() == [1, 2, 3, 4, 5] and frame["loss"].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert frame["grad_norm"].tolist()[:2] == [9.0, 9.0] and frame["grad_norm"][2:].isna().all()
    assert frame["attempt"].tolist() == [0, 0, 1, 1, 1]


def test_the_columnar_path_and_the_line_rule_give_the_same_frame(tmp_path, monkeypatch):
    """A clean engine-shaped file (NaN where a time was not measured) read by the fast path equals the
    same file read line by line (the fast path switched off)."""
    from workbench.runfolder import fastjson

    monkeypatch.setattr(MetricTail, "COLUMNAR_MIN_BYTES", 0)
    folder = tmp_path / "metrics"
    writer = JsonlWriter(folder / "rank0.jsonl")
    for step in range(1, 301):
        writer.write({"rank": 0, "step": step, "epoch": 0, "time": 1e9 + step, "loss": 1.0 / step,
                      "comm_wait_s": math.nan, "samples_per_s": 320, "attempt": 0})
    writer.close()
    fast = RankFrames(folder)
    fast.poll()
    assert fastjson.read_block((folder / "rank0.jsonl").read_bytes()) is not None  # it was the fast path
    monkeypatch.setattr(fastjson, "read_block", lambda block, max_line_bytes=0: None)
    slow = RankFrames(folder)
    slow.poll()
    pd.testing.assert_frame_equal(fast.frame(), slow.frame())


def test_a_cold_read_of_several_large_ranks_in_two_threads_equals_the_line_rule(tmp_path, monkeypatch):
    """Ranks with more than a columnar block waiting are read by two threads (RankFrames._read_tails):
    the frame, the damaged-line count and the warning naming the line are those of one thread reading
    every line by the line rule."""
    from workbench.runfolder import fastjson

    folder = tmp_path / "metrics"
    for rank in range(3):
        lines = [json.dumps({"rank": rank, "step": step, "epoch": 0, "time": 1e9 + step, "loss": 1.0 / step,
                             "lr": 1e-3, "comm_wait_s": math.nan, "samples_per_s": 320.5 + rank, "attempt": 0,
                             "padding_to_make_the_file_large": 0.123456789}) for step in range(1, 1501)]
        if rank == 1:
            lines[700] = lines[700][:40]  # a torn line in the middle of rank 1
        (folder / f"rank{rank}.jsonl").parent.mkdir(exist_ok=True)
        (folder / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
        assert (folder / f"rank{rank}.jsonl").stat().st_size > MetricTail.COLUMNAR_MIN_BYTES
    threads = []
    real_read = MetricTail.read_batches
    monkeypatch.setattr(MetricTail, "read_batches",
                        lambda self: threads.append(__import__("threading").current_thread().name) or real_read(self))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DamagedFileWarning)
        fast = RankFrames(folder)
        fast.poll()
    assert all(name.startswith("workbench-read") for name in threads) and len(threads) == 3
    assert fast.skipped == 1 and _named_lines(caught) == {("rank1", 701)}
    monkeypatch.setattr(MetricTail, "read_batches", real_read)
    monkeypatch.setattr(fastjson, "read_block", lambda block, max_line_bytes=0: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedFileWarning)
        slow = RankFrames(folder)
        slow.poll()
    pd.testing.assert_frame_equal(fast.frame(), slow.frame())
    assert len(fast.frame()) == 3 * 1500 - 1


@pytest.mark.parametrize("line", DAMAGED + ODD, ids=repr)
def test_each_odd_line_among_clean_records_reads_as_the_line_rule_says(tmp_path, line):
    """One odd line in a block of clean records: the block is read as the line rule reads it, whether
    the columnar path takes it or hands it back."""
    run_dir = _run_folder(tmp_path / "run")
    clean = b"".join(json.dumps({"rank": 0, "step": s, "time": 1e9 + s, "loss": 0.5, "w": 0.25}).encode() + b"\n"
                     for s in range(1, 6))
    _append(run_dir.metrics(0), clean + line + b"\n" + clean.replace(b'"loss"', b'"lr"'))
    with warnings.catch_warnings(), mock.patch.object(MetricTail, "COLUMNAR_MIN_BYTES", 0):
        warnings.simplefilter("ignore", DamagedFileWarning)
        run = Run(run_dir.root)
        _check(run, run_dir.folder("metrics"), records.MAX_LINE_BYTES)
    damaged = [n for n, record in _reference_lines(run_dir.metrics(0), records.MAX_LINE_BYTES) if record is None]
    assert run.metric_frames.skipped == len(damaged)


def test_without_polars_every_block_is_read_line_by_line(tmp_path, monkeypatch):
    import sys

    run_dir = _run_folder(tmp_path / "run")
    writer = JsonlWriter(run_dir.metrics(0))
    for step in range(1, 2001):
        writer.write({"rank": 0, "step": step, "time": 1e9 + step, "loss": 1.0 / step})
    writer.close()
    monkeypatch.setitem(sys.modules, "polars", None)  # as if it were not installed: import polars fails
    frame = Run(run_dir.root).metrics()
    assert frame["step"].tolist() == list(range(1, 2001)) and frame["loss"].iloc[-1] == 1 / 2000
