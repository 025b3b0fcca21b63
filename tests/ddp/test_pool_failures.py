"""A job in a warm pool fails and prints as a cold run does, for real (2 gloo ranks, 1 thread each):
its output goes through its agent's tee (live, line by line, stdout and stderr interleaved in
logs/rank{R}.log); a raising rank is named with the user's frame and no workbench frames; torch's
@record error file is read into the failure; a meeting port taken before the pool's ranks meet is
replaced by a fresh one; nothing is left once the pool is closed."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import assert_nothing_left, cfg, wait_until

pytestmark = [pytest.mark.ddp]

FAULTS = SCRIPTS / "faults.py"
ENGINE_FRAMES = ("workbench/engine", "workbench/launch", "submitit", "runpy", "RankFailed")


def _cfg(tmp_path: Path):
    return cfg(tmp_path, max_steps=5, checkpoint_every_steps=None)


def _no_workbench_frames(text: str) -> None:
    shown = [frame for frame in ENGINE_FRAMES if frame in text]
    assert not shown, f"workbench's own frames reached the user ({shown}):\n{text}"


@pytest.mark.timeout(200)
def test_a_raising_rank_in_a_pool_is_named_in_its_own_frames_with_its_logs(pool):
    run = pool.submit_script(FAULTS, ["raise", "1"])
    assert run.wait(timeout=120).state == "failed"
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "ValueError"), failure
    assert "injected failure on rank 1" in failure.message
    assert 'faults.py", line' in failure.traceback and "in loss_fn" in failure.traceback
    _no_workbench_frames(failure.traceback)
    assert [f.rank for f in run.failures()][:1] == [1], "every view names the same cause"
    both = run.dir.both_streams(1)
    assert both.exists() and oct(both.stat().st_mode & 0o777) == "0o600"
    log = run.logs(1)
    assert "ValueError: injected failure on rank 1" in log and "in loss_fn" in log, log
    _no_workbench_frames(log)
    assert "injected failure" in run.logs(1, "err"), "the job's stderr file has it too"
    following = pool.submit_fn(_ranks_sum)  # fresh workers: the pool serves on
    assert following.wait(timeout=90).state == "finished", following.exception()
    assert "injected failure" not in following.logs(1), "the next job's logs are its own"


def _ranks_sum():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


@pytest.mark.timeout(200)
def test_unflushed_prints_in_a_pool_are_live_and_interleaved(pool, tmp_path):
    gate = tmp_path / "gate"
    run = pool.submit_script(FAULTS, ["print", str(gate)])
    wait_until(lambda: "ready" in run.logs(0), 60, "rank 0's unflushed lines in its log while it waits")
    assert run.status().state == "running"
    lines = [line for line in run.logs(0).splitlines() if line in ("out 0", "err 0", "out 1", "err 1", "ready")]
    assert lines == ["out 0", "err 0", "out 1", "err 1", "ready"], run.logs(0)
    gate.touch()
    assert run.wait(timeout=60).state == "finished", run.exception()
    assert "out 1" in run.logs(0, "out") and "err 1" in run.logs(0, "err") and "out 1" not in run.logs(0, "err")



@pytest.mark.timeout(200)
def test_the_record_error_file_of_a_pool_job_is_read_into_the_failure(pool, tmp_path):
    script = tmp_path / "recorded.py"
    shutil.copy(SCRIPTS / "recorded.py", script)
    run = pool.submit_script(script, [])
    assert run.wait(timeout=120).state == "failed"
    env = json.loads(next(line for line in run.logs(0, "out").splitlines() if line.startswith("{")))
    assert env == {"TORCHELASTIC_ERROR_FILE": str(run.dir.elastic_error(0)),
                   "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "KeyError") and "from a recorded main" in failure.message, failure
    assert "recorded.py" in failure.traceback


@pytest.mark.timeout(240)
def test_a_pool_port_taken_before_the_ranks_meet_is_replaced_by_a_fresh_one(tmp_path, monkeypatch):
    """Another process listens on the port the submitter chose for the pool: its ranks meet again
    on a fresh port and the pool serves its jobs."""
    import workbench.launch.executors as executors

    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setattr(executors, "free_port", lambda host="127.0.0.1": port)
    try:
        pool = workbench.Pool(_cfg(tmp_path), idle_timeout_s=600)
        try:
            pool.wait_ready(180)
            run = pool.submit_fn(_ranks_sum)
            assert run.wait(timeout=90).state == "finished", run.exception()
            assert run.results() == [2.0, 2.0]
            said = (pool.dir.read_meta() or {}).get("warnings") or []
            assert any(f"port {port} was taken" in w for w in said), said
        finally:
            pool.close()
    finally:
        taken.close()
    assert_nothing_left(pool.dir.root)
