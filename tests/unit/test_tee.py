"""engine.tee on real pipes (no process): lines interleaved in the order written, a partial last line
kept, and a warm worker's route marks obeyed byte for byte: what comes before a mark stays on the
old side, a mark cut across two writes still switches, a mark with another token is only text."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from workbench.engine.tee import _MARK, Tee

pytestmark = [pytest.mark.timeout(30)]


def _pipes():
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    worker = SimpleNamespace(stdout=os.fdopen(out_r, "rb", buffering=0), stderr=os.fdopen(err_r, "rb", buffering=0))
    return worker, out_w, err_w


def _settle(path, count):
    """Wait until `path` holds `count` lines (the tee's threads copy as data comes)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.005)


def test_lines_of_both_streams_interleave_in_the_order_written(tmp_path, capfd):
    worker, out, err = _pipes()
    both = tmp_path / "rank0.log"
    tee = Tee(worker, both)
    for i, (fd, text) in enumerate([(out, b"out 0\n"), (err, b"err 0\n"), (out, b"out 1\n"), (err, b"err 1\n")]):
        os.write(fd, text)
        _settle(both, i + 1)
    os.write(out, b"no newline")
    os.close(out)
    os.close(err)
    tee.close()
    assert both.read_text().splitlines() == ["out 0", "err 0", "out 1", "err 1", "no newline"]
    assert oct(both.stat().st_mode & 0o777) == "0o600"
    seen = capfd.readouterr()
    assert seen.out == "out 0\nout 1\nno newline" and seen.err == "err 0\nerr 1\n", "the agent's streams get all"


def _mark(token: str, where: dict) -> bytes:
    return _MARK + token.encode() + b":" + json.dumps(where).encode() + b"\n"


def test_route_marks_switch_each_stream_at_its_byte(tmp_path, capfd):
    worker, out, err = _pipes()
    tee = Tee(worker, None, "t0k")
    job = {"out": str(tmp_path / "job.out"), "err": str(tmp_path / "job.err"), "both": str(tmp_path / "rank1.log")}
    os.write(out, b"before the job\n")
    marked = _mark("t0k", job)
    os.write(out, b"partial " + marked[:7])  # a mark cut across two writes
    time.sleep(0.05)
    os.write(out, marked[7:] + b"job out\n")
    os.write(err, _mark("t0k", job) + b"job err\n")
    _settle(tmp_path / "rank1.log", 2)
    os.write(out, _mark("other", {"out": str(tmp_path / "x")}) + b"job out 2\n")  # not the agent's token: text
    _settle(tmp_path / "job.out", 3)
    os.write(out, _mark("t0k", {}) + b"after the job\n")
    os.write(err, _mark("t0k", {}) + b"after on err\n")
    os.close(out)
    os.close(err)
    tee.close()
    assert (tmp_path / "job.out").read_bytes().endswith(b"job out 2\n")
    assert (tmp_path / "job.out").read_bytes().startswith(b"job out\n" + _MARK + b"other:")
    assert (tmp_path / "job.err").read_text() == "job err\n"
    job_lines = (tmp_path / "rank1.log").read_text().split("\n")  # (str.splitlines splits at the mark's \x1e)
    assert sorted(job_lines[:2]) == ["job err", "job out"] and job_lines[-2] == "job out 2", job_lines
    assert not (tmp_path / "x").exists()
    seen = capfd.readouterr()
    assert seen.out == "before the job\npartial after the job\n" and seen.err == "after on err\n"
