"""The per-rank JSONL stream: flushed writes, incremental tail, partial and damaged lines, requeues."""

from __future__ import annotations

import json

import pytest

from workbench.records import DamagedFileWarning
from workbench.stream import JsonlTail, JsonlWriter, RankFrames

pytestmark = pytest.mark.timeout(30)


def test_tail_reads_only_new_complete_lines(tmp_path):
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []  # no file yet
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')  # a record being written
    assert [r["step"] for r in tail.read_new()] == [1, 2]
    assert tail.read_new() == []
    with open(path, "a") as fh:
        fh.write('ss": 0.5}\n')
    assert tail.read_new() == [{"step": 3, "loss": 0.5}]


def test_writer_flushes_each_record_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "rank0.jsonl"
    writer = JsonlWriter(path)
    writer.write({"step": 1})
    assert json.loads(path.read_text()) == {"step": 1}  # on disk before close
    writer.close()
    with open(path, "a") as fh:
        fh.write('{"step": 2, "lo')  # a process killed mid-line
    again = JsonlWriter(path)
    again.write({"step": 3})
    again.close()
    with pytest.warns(DamagedFileWarning, match="line 2"):  # the torn line, named once
        assert [r["step"] for r in JsonlTail(path).read_new()] == [1, 3]


def test_rank_frames_keep_the_newest_attempt_for_repeated_steps(tmp_path):
    folder = tmp_path / "metrics"
    writer = JsonlWriter(folder / "rank0.jsonl")
    for step in (1, 2, 3):
        writer.write({"rank": 0, "step": step, "loss": 1.0, "attempt": 0})
    frames = RankFrames(folder)
    assert len(frames.poll()) == 3
    for step in (2, 3, 4):  # resumed from the checkpoint at step 1
        writer.write({"rank": 0, "step": step, "loss": 2.0, "attempt": 1})
    frames.poll()
    frame = frames.frame()
    assert list(frame["step"]) == [1, 2, 3, 4]
    assert list(frame["loss"]) == [1.0, 2.0, 2.0, 2.0]
    fresh = RankFrames(folder)  # everything read in one poll gives the same
    fresh.poll()
    assert fresh.frame().equals(frame)


def test_rank_frames_thin_long_runs_per_rank(tmp_path):
    folder = tmp_path / "metrics"
    for rank in (0, 1):
        writer = JsonlWriter(folder / f"rank{rank}.jsonl")
        for step in range(1, 1001):
            writer.write({"rank": rank, "step": step})
        writer.close()
    frames = RankFrames(folder)
    frames.poll()
    thin = frames.frame(max_points=100)
    assert thin.groupby("rank").size().max() <= 100
    assert (thin.groupby("rank")["step"].max() == 1000).all()
