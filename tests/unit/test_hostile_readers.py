"""Readers that cannot be broken by what a run folder holds: damaged lines are skipped, counted and
named once; every valid record comes back exactly once whatever the poll schedule; status, error,
summary and run.json files that do not hold an object read as absent (workbench.runfolder.records)."""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import JobConfig
from workbench.errors import DamagedFileWarning
from workbench.launch.run import Run
from workbench.runfolder import records
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.reader import JsonlTail, RankFrames
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(120)
EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "150"))
"""Examples per property test (raise it for a long hunt: WORKBENCH_FUZZ_EXAMPLES=5000)."""

GARBAGE = [
    b"42", b"null", b"[]", b'"text"', b"\0" * 300, b"\xff\xfe\xfd", b"\xc3(", b'{"rank": 0, "step": "abc"}',
    b'{"rank": null, "step": 1}', b'{"rank": 0}', b'{"rank": -1, "step": 1}', b'{"rank": 0, "step": 1.5}',
    b'{"rank": 0, "step": 1, "time": "noon"}', b'{"rank": 0, "step": 1, "time": NaN}', b"[" * 5000 + b"]" * 5000,
    b'{"a": ' * 3000 + b"1" + b"}" * 3000, b'{"rank": 0, "step": ' + b"9" * 5000 + b"}", b'{"rank": 0, "step": 1',
    b"\xef\xbb\xbf{}", b'{"rank": 0, "step": 2} trailing', b"\x1b[2J",
]
"""Lines a crashed node, a careless edit or a hostile colleague leave; none of them is a valid record."""


def _record(seq: int, rank: int = 0) -> dict:
    return {"rank": rank, "step": seq + 1, "time": 1000.0 + seq, "loss": 0.5, "seq": seq}


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    pieces, last = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        pieces.append(data[last:cut])
        last = cut
    return pieces


@st.composite
def _stream(draw: st.DrawFn) -> tuple[bytes, list[dict]]:
    """A file of valid records with arbitrary bytes (and known garbage) between them."""
    parts, valid = [], []
    for seq in range(draw(st.integers(0, 12))):
        for _ in range(draw(st.integers(0, 2))):
            junk = draw(st.one_of(st.binary(max_size=120), st.sampled_from(GARBAGE),
                                  st.integers(260, 700).map(lambda n: b"x" * n)))  # longer than the test's cap
            parts.append(junk + b"\n")
        record = _record(seq)
        valid.append(record)
        parts.append(json.dumps(record).encode() + b"\n")
    return b"".join(parts), valid


class SmallTail(JsonlTail):
    """Small limits, so chunk boundaries and over-long lines happen in small examples."""

    CHUNK_BYTES = 300
    MAX_LINE_BYTES = 250


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=_stream(), data=st.data(), small=st.booleans())
def test_every_valid_record_comes_back_once_whatever_the_writes_and_polls(tmp_path_factory, stream, data, small):
    raw, valid = stream
    path = tmp_path_factory.mktemp("tail") / "rank0.jsonl"
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=8))
    polls = data.draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    tail = (SmallTail if small else JsonlTail)(path, records.METRIC)
    got = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedFileWarning)
        with open(path, "wb") as fh:
            for piece, poll in zip(_pieces(raw, cuts), polls):
                fh.write(piece)
                fh.flush()
                if poll:
                    got += tail.read_new()
        got += tail.read_new()
    assert [r for r in got if "seq" in r] == valid
    assert tail.offset == len(raw)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=2000))
def test_a_single_json_file_of_any_bytes_reads_as_an_object_or_absent(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("obj") / "rank0.json"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedFileWarning)
        for schema in (records.STATUS, records.ERROR, records.SUMMARY, records.META, records.ANY_OBJECT):
            found = records.read_object(path, schema)
            assert found is None or isinstance(found, dict)


def test_each_damaged_line_is_skipped_counted_and_named_once(tmp_path):
    path = tmp_path / "rank0.jsonl"
    lines = [json.dumps(_record(0)).encode(), *GARBAGE, json.dumps(_record(1)).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    tail = JsonlTail(path, records.METRIC)
    with pytest.warns(DamagedFileWarning) as caught:
        got = tail.read_new()
    assert [r["seq"] for r in got] == [0, 1]
    assert tail.skipped == len(GARBAGE)
    assert len(caught) == 1  # one warning per read, naming the file and the first damaged line
    message = str(caught[0].message)
    assert str(path) in message and "line 2" in message and f"{len(GARBAGE) - 1} more" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing new: nothing said again
        assert tail.read_new() == []


def test_a_partial_last_line_waits_and_a_runaway_line_is_skipped_as_it_streams(tmp_path):
    path = tmp_path / "rank0.jsonl"
    tail = SmallTail(path, records.METRIC)
    with open(path, "wb") as fh:
        fh.write(json.dumps(_record(0)).encode() + b"\n" + b'{"rank": 0, "st')
        fh.flush()
        assert [r["seq"] for r in tail.read_new()] == [0]
        fh.write(b"x" * 400)  # no end in sight: more than MAX_LINE_BYTES is never a record
        fh.flush()
        with pytest.warns(DamagedFileWarning, match="line 2"):
            assert tail.read_new() == []
        assert tail.offset == path.stat().st_size  # the runaway bytes are not kept or re-read
        fh.write(b"yyy\n" + json.dumps(_record(1)).encode() + b"\n")
        fh.flush()
        assert [r["seq"] for r in tail.read_new()] == [1]
    assert tail.skipped == 1 and tail.line == 3


def test_wrong_typed_fields_are_dropped_and_the_record_kept(tmp_path):
    path = tmp_path / "rank0.jsonl"
    record = {"rank": 0, "step": 3, "time": 5.0, "loss": "abc", "lr": None, "mem_mb": 10**30, "note": [1, 2],
              "host": "n\x1b[31m1", "bad": "\ud800", "acc": 0.9, "epoch": 1}
    path.write_text(json.dumps(record) + "\n")
    (got,) = JsonlTail(path, records.METRIC).read_new()
    assert got == {"rank": 0, "step": 3, "time": 5.0, "acc": 0.9, "epoch": 1, "host": "n\\x1b[31m1"}


def test_nul_bytes_a_crashed_node_left_do_not_hide_the_next_record(tmp_path):
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(json.dumps(_record(0)).encode() + b"\n" + b"\0" * 4096 + json.dumps(_record(1)).encode() + b"\n")
    assert [r["seq"] for r in JsonlTail(path, records.METRIC).read_new()] == [0, 1]


def test_lines_of_megabytes_and_deep_nesting_cost_bounded_time(tmp_path):
    path = tmp_path / "rank0.jsonl"
    nested = b"[" * (records.MAX_LINE_BYTES // 2 - 10) + b"]" * (records.MAX_LINE_BYTES // 2 - 10)
    path.write_bytes(nested + b"\n" + b"7" * (3 * records.MAX_LINE_BYTES) + b"\n" + json.dumps(_record(0)).encode()
                     + b"\n")
    tail = JsonlTail(path, records.METRIC)
    with pytest.warns(DamagedFileWarning):
        assert [r["seq"] for r in tail.read_new()] == [0]
    assert tail.skipped == 2


def test_rank_frames_skip_garbage_between_a_ranks_records(tmp_path):
    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "rank0.jsonl").write_bytes(b"\n".join([json.dumps(_record(0)).encode(), b"42", b"null", b"\0" * 64,
                                                     json.dumps(_record(1)).encode()]) + b"\n")
    (folder / "rank1.jsonl").write_bytes(json.dumps(_record(0, rank=1)).encode() + b"\n" + b"\xff\n")
    (folder / "rank\u0663.jsonl").write_text("{}\n")  # not an ASCII rank: not a rank file
    frames = RankFrames(folder)
    with pytest.warns(DamagedFileWarning):
        frames.poll()
    frame = frames.frame()
    assert frame.groupby("rank")["step"].apply(list).to_dict() == {0: [1, 2], 1: [1]}
    assert frames.skipped == 4


# --- a whole run folder of garbage -----------------------------------------------------------------
def _garbage_run(tmp_path: Path) -> RunDir:
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    writer = JsonlWriter(run.metrics(0))
    for seq in range(5):
        writer.write(_record(seq))
    writer.close()
    with open(run.metrics(0), "ab") as fh:
        fh.write(b"42\nnull\n" + b"\0" * 100 + b"\n\xff\xfe\n[1]\n")
    run.metrics(1).write_bytes(b'{"rank": 1, "step": "abc"}\n{"rank": null, "step": 2}\n')
    run.events(0).write_bytes(b'{"event": "start", "rank": 0, "total_steps": "many", "lr": [1]}\n'
                              b'{"event": "sync_check", "rank": 0, "in_sync": "yes", "diverged_ranks": 3}\n'
                              b'{"event": "warning", "rank": 0, "message": {"a": 1}}\n7\n')
    run.status(0).write_bytes(b"[1, 2, 3]")
    run.status(1).write_bytes(b'{"state": ["running"], "time": "now", "step": "x"}')
    run.error(1).write_bytes(b"\0" * 64)
    run.summary.write_bytes(b"42")
    return run


@pytest.mark.filterwarnings("ignore::workbench.runfolder.records.DamagedFileWarning")
def test_status_exception_metrics_and_health_survive_a_run_folder_of_garbage(tmp_path):
    run = _garbage_run(tmp_path)
    handle = Run(run.root)
    with pytest.warns(DamagedFileWarning):
        status = handle.status()
    assert [r.state for r in status.ranks] == ["pending", "pending"]  # no readable heartbeat
    assert status.state == "failed"  # the job ended and no rank finished
    assert handle.exception(status) is None  # a damaged error file reads as absent, as its warning says
    assert handle.metrics()["step"].tolist() == [1, 2, 3, 4, 5]
    assert handle.event_summary().total_steps is None and handle.health()["in_sync"] is None
    with pytest.raises(Exception, match="failed"):
        handle.result()


def test_a_damaged_run_json_still_shows_the_run_and_a_broken_one_is_one_line(tmp_path, capsys):
    from workbench.cli import main

    run = _garbage_run(tmp_path)
    run.meta.write_text('{"world_size": "lots", "job_id": "$(rm -rf ~)", "executor": "local"}')
    assert Run.load(run.root).world_size == 2  # from the ranks' files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedFileWarning)
        assert main(["show", str(run.root)]) == 0  # a failed run, shown (show exits 0: it showed the run)
    out = capsys.readouterr()
    assert "failed" in out.out and "Traceback" not in out.err
    run.meta.write_bytes(b"\xff" * 10)
    assert main(["show", str(run.root)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"workbench: {run.root}: not a workbench run folder (its run.json is "
                                            "damaged); give the folder a run printed, e.g. "
                                            "runs/quickstart-20250101-120000-000")
    assert "Traceback" not in err
    assert main(["show", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == (f"workbench: {tmp_path / 'nothing'}: no such folder; give the run folder "
                                       "`workbench run` printed\n")


def test_the_dashboard_state_reads_a_run_folder_of_garbage(tmp_path):
    from workbench.ui.state import read_state

    run = _garbage_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedFileWarning)
        state = read_state(Run(run.root), max_points=100)
    assert state.state == "failed" and "see the logs" in state.failure  # a damaged error file reads as absent


def test_a_garbage_status_of_a_neighbour_does_not_stop_a_ranks_heartbeat(tmp_path):
    from workbench.engine.monitor import RankMonitor

    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    run.status(1).write_bytes(b'{"state": "running", "time": "yesterday", "step": []}')
    monitor = RankMonitor(run, 0, 2, heartbeat_s=0.05).start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DamagedFileWarning)
            first = json.loads(run.status(0).read_text())["time"]
            deadline = time.monotonic() + 10
            while json.loads(run.status(0).read_text())["time"] == first and time.monotonic() < deadline:
                time.sleep(0.02)
            assert json.loads(run.status(0).read_text())["time"] > first  # it beat again, having read rank 1
            assert monitor._thread.is_alive() and not run.error(1).exists()
    finally:
        monitor.close()


def test_the_reattach_ignores_a_job_id_that_is_not_one(tmp_path):
    from workbench.launch.run import _reattach_job

    run = _garbage_run(tmp_path)
    assert _reattach_job({"executor": "local", "job_id": "12; rm -rf ~"}, run) is None
    assert _reattach_job({"executor": "slurm", "job_id": "123", "world_size": 10**12}, run) is not None


def test_write_json_atomic_then_read_round_trip(tmp_path):
    path = tmp_path / "status" / "rank0.json"
    write_json_atomic(path, {"state": "running", "time": 1.0, "step": 2})
    assert RunDir(tmp_path).read_status(0) == {"state": "running", "time": 1.0, "step": 2}


@pytest.mark.parametrize("planted", [b'{"type": 5}', b'{"type": "ValueError", "rank": 1}', b'{"message": "x"}',
                                     b'{"type": "ValueError", "message": "x", "rank": "1"}',
                                     b'{"type": "ValueError", "message": "x", "rank": 1, "time": "noon"}'])
def test_an_error_file_without_the_fields_of_one_is_damaged_not_a_failure(tmp_path, planted):
    """issue 30, item 8: `{"type": 5}` in errors/ made a finished run read failed, "UnknownError: "."""
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    for rank in (0, 1):
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "time": time.time(), "step": 5})
    write_json_atomic(run.summary, {"status": "finished", "steps": 5, "world_size": 2})
    run.error(1).write_bytes(planted)
    handle = Run(run.root)
    with pytest.warns(DamagedFileWarning, match=r"rank1\.json: .*; read as if it were absent"):
        status = handle.status()
    assert status.state == "finished"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per file version, above
        assert handle.exception(status) is None and handle.failures(status) == []
        assert run.read_error(1) is None


def test_the_error_records_workbench_writes_are_read_back_whole(tmp_path):
    from workbench.runfolder.failures import controller_failure, error_record, write_controller_failure, write_error

    run = RunDir(tmp_path / "run").create()
    write_error(run, 1, error_record(1, "ValueError", "bad batch", "tb", 0, "node1", 7))
    assert run.read_error(1)["message"] == "bad batch"
    write_controller_failure(run, "the local controller was killed", "123", "the submitting process")
    assert controller_failure(run, "123")["rank"] == -1  # the controller's record keeps its rank


def test_what_a_rank_raises_once_it_got_its_stop_signal_is_an_interruption_not_a_failure(tmp_path, monkeypatch):
    """SIGTERM in a collective's completion callback: torch wraps the worker's Terminated in a
    RuntimeError of its own, which must still read as the cancel it is (seen in a sweep's cancel)."""
    from workbench.engine import stopsignal
    from workbench.engine.monitor import RankMonitor

    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    wrapped = RuntimeError("Got the following error when running the callback: Terminated: SIGTERM")
    monitor = RankMonitor(run, 0, 2, heartbeat_s=30).start()
    monkeypatch.setattr(stopsignal, "received", signal.SIGTERM)
    with pytest.raises(RuntimeError), monitor.reporting():
        raise wrapped
    assert json.loads(run.status(0).read_text())["state"] == "interrupted" and not run.error(0).exists()
    monkeypatch.setattr(stopsignal, "received", None)  # without the signal, the same error is a failure
    other = RankMonitor(run, 1, 2, heartbeat_s=30).start()
    with pytest.raises(RuntimeError), other.reporting():
        raise RuntimeError("a bug of the user's")
    assert json.loads(run.status(1).read_text())["state"] == "failed" and run.error(1).exists()


def test_the_result_of_a_run_whose_ranks_just_said_finished_waits_for_rank_0s_summary(tmp_path):
    """Rank 0 writes the summary just after its status (engine/rank.py): a wait() that saw both
    statuses can return in between, and result() right after it must not say "no summary yet"."""
    import threading

    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    for rank in range(2):
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": 10, "time": time.time()})
    loaded = Run(run.root)
    assert loaded.status().state == "finished" and not run.summary.exists()
    timer = threading.Timer(0.3, write_json_atomic, [run.summary, {"status": "finished", "steps": 10}])
    timer.start()
    try:
        assert loaded.result() == {"status": "finished", "steps": 10}
    finally:
        timer.cancel()
