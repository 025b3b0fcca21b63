"""The per-rank JSONL stream: flushed writes, incremental tail, partial and damaged lines, requeues."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import DamagedFileWarning
from workbench.runfolder.reader import JsonlTail, RankFrames
from workbench.runfolder.writer import JsonlWriter

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
    assert frames.poll() == 3
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


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30),
                                 st.sampled_from(["plain", "plain", "plain", "resume", "text"])),
                       min_size=1, max_size=12),
       max_points=st.one_of(st.none(), st.integers(1, 40)))
def test_rank_frames_columns_and_frame_match_plain_pandas(tmp_path_factory, chunks, max_points):
    """Whatever arrives (in-order numeric records kept as numpy columns, a repeated step or a text field
    taking the general way), the frame and the status columns equal what plain pandas makes of the
    same records: the newest row per (rank, step), thinned per rank, sorted by step then rank."""
    import pandas as pd

    from workbench.runfolder.reader import thin

    folder = tmp_path_factory.mktemp("metrics")
    frames, written, next_step = RankFrames(folder), {}, {0: 1, 1: 1, 2: 1}
    for rank, count, kind in chunks:
        writer = JsonlWriter(folder / f"rank{rank}.jsonl")
        first = next_step[rank] - (2 if kind == "resume" and next_step[rank] > 2 else 0)  # steps trained again
        for step in range(first, first + count):
            record = {"rank": rank, "step": step, "time": 1000.0 + step, "loss": 1.0 / step}
            if kind == "text" and step == first:
                record["note"] = "text"  # a field a numeric column cannot hold
            writer.write(record)
            written.setdefault(rank, {})[step] = record
        writer.close()
        next_step[rank] = first + count
        frames.poll()
    expected = []
    for rank in sorted(written):
        part = pd.DataFrame.from_records([written[rank][s] for s in sorted(written[rank])])
        expected.append(thin(part, max_points) if max_points else part)
    want = pd.concat(expected, ignore_index=True).sort_values(["step", "rank"], kind="stable").reset_index(drop=True)
    got = frames.frame(max_points)
    cols = ["rank", "step", "time", "loss"]
    pd.testing.assert_frame_equal(got[cols].astype(float), want[cols].astype(float))
    for rank, columns in frames.columns(("step", "time")).items():
        assert columns["step"].tolist() == sorted(written[rank])
        assert columns["time"].tolist() == [1000.0 + s for s in sorted(written[rank])]
