"""A rank that ends early never loses a logged step.

The engine all-reduces the losses of several logged steps at once (engine.steplog), so at any
moment a rank holds the records of up to 10 steps awaiting a reduce.  Every way a rank can end
early writes them: it raises (its own records), a peer failed (the heartbeat thread's abort), the
run is cancelled (SIGTERM).  Records written there keep the rank's own loss; `loss_reduced` only
where their reduce had completed."""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import threading

import pytest
import torch

import workbench
from tests.support.lifecycle import ENDLESS, OPTIONS, assert_nothing_left, cfg, wait_for_step
from tests.support.tasks_for_tests import failing_at
from workbench.engine.rendezvous import free_port
from workbench.runfolder.layout import RunDir

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]


def _steps_by_rank(run: workbench.Run) -> dict[int, list[int]]:
    frame = run.metrics()
    return {int(rank): sorted(group["step"].tolist()) for rank, group in frame.groupby("rank")}


def test_a_rank_that_raises_at_step_n_leaves_every_earlier_step_of_every_rank(tmp_path):
    # synthetic steps take about a millisecond: the reduce cadence is 10 steps, so both ranks hold
    # records when rank 1 raises at step 37 (rank 1 through its own raise, rank 0 through the
    # peer's failure: its abort, or the broken collective, whichever comes first)
    run = workbench.submit(cfg(tmp_path, max_steps=1000, checkpoint_every_steps=1000),
                           task=functools.partial(failing_at, 37, rank=1, **OPTIONS))
    assert run.wait(timeout=180).state == "failed"
    assert run.failures()[0].rank == 1
    assert _steps_by_rank(run) == {0: list(range(1, 37)), 1: list(range(1, 37))}
    frame = run.metrics()
    assert frame["loss"].notna().all(), "every record keeps its rank's own loss"
    assert_nothing_left(run.folder)


def test_a_cancelled_run_keeps_every_step_its_ranks_finished(tmp_path):
    run = workbench.submit(cfg(tmp_path, checkpoint_every_steps=1000, **ENDLESS))
    wait_for_step(run, 30)
    run.cancel()
    assert run.wait(timeout=120).state == "cancelled"
    events = run.events()
    stopped = events[events["event"] == "interrupted"].set_index("rank")["step"]
    assert sorted(stopped.index) == [0, 1], "both ranks were stopped by SIGTERM (not killed)"
    for rank, steps in _steps_by_rank(run).items():
        assert steps == list(range(1, steps[-1] + 1))
        # the record of the step the signal landed in may not have been made yet
        assert steps[-1] in (stopped[rank] - 1, stopped[rank]), (rank, steps[-1], stopped[rank])
    assert_nothing_left(run.folder)


# --- a peer's failure, seen by the heartbeat thread while a reduce is in flight -------------------
def _rank(rank: int, port: int, folder: str, done: mp.Event) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from workbench.engine.monitor import RankMonitor
    from workbench.engine.steplog import StepLogger

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    monitor = RankMonitor(RunDir(folder), rank, 2).start()
    logger = StepLogger(monitor, world_size=2, device="cpu", max_every=10, every_s=3600.0)
    last = 15 if rank == 0 else 11  # rank 1 never starts the reduce of step 12
    for step in range(1, last + 1):
        logger.poll()
        logger.end_step(step, {"rank": rank, "step": step, "loss": None}, torch.tensor(float(step)), stop=False)
    if rank == 1:
        monitor.fail(RuntimeError("rank 1 stops before the reduce of step 12"))
        done.wait(60)  # keeps its end of the group open until rank 0 is gone
        os._exit(1)
    threading.Event().wait(60)  # rank 0's heartbeat ends this process (PEER_FAILED_EXIT_CODE)
    os._exit(3)


def test_a_peer_failure_seen_by_the_heartbeat_writes_the_held_records(tmp_path):
    from workbench.engine.monitor import PEER_FAILED_EXIT_CODE

    ctx = mp.get_context("spawn")
    done = ctx.Event()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(rank, port, str(tmp_path), done)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    try:
        procs[0].join(timeout=120)
        assert procs[0].exitcode == PEER_FAILED_EXIT_CODE
    finally:
        done.set()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    records = [json.loads(line) for line in RunDir(tmp_path).metrics(0).read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 16))
    assert all(r["loss"] == float(r["step"]) for r in records)
    # steps 1 and 2 were reduced alone; 3..12 went into step 12's reduce, which rank 1 never joined
    assert [r["step"] for r in records if "loss_reduced" in r] == [1, 2]
    assert all(r["loss_reduced"] == pytest.approx(r["step"]) for r in records if "loss_reduced" in r)


# --- a cancel landing while a completed reduce's records are being written --------------------------
def _cancelled_while_writing(port: int, folder: str) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from workbench.engine.monitor import RankMonitor
    from workbench.engine.steplog import StepLogger

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    monitor = RankMonitor(RunDir(folder), 0, 1).start()
    logger = StepLogger(monitor, world_size=1, device="cpu", max_every=10, every_s=3600.0)
    write = monitor.log_metrics

    def interrupted_once(record):  # SIGTERM's KeyboardInterrupt, raised where a signal can land
        if record["step"] == 3 and not getattr(interrupted_once, "done", False):
            interrupted_once.done = True
            raise KeyboardInterrupt("SIGTERM")
        write(record)

    monitor.log_metrics = interrupted_once
    try:
        for step in range(1, 26):  # steps 3..12 go into step 12's reduce, written by step 22's flush
            logger.end_step(step, {"rank": 0, "step": step, "loss": None}, torch.tensor(float(step)), stop=False)
    except KeyboardInterrupt:
        logger.write_held()  # what every early end calls (RankMonitor.close)
    monitor.metrics.close()
    dist.destroy_process_group()


def test_a_cancel_while_a_reduces_records_are_written_loses_none_of_them(tmp_path):
    """Found by CI: a cancelled run's rank 0 lacked steps 52-58 (its 59 written). The flush that writes
    a completed reduce's records let go of them before writing them, so a SIGTERM landing there left
    write_held nothing to write."""
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_cancelled_while_writing, args=(free_port(), str(tmp_path)))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    steps = [json.loads(line)["step"] for line in RunDir(tmp_path).metrics(0).read_text().splitlines()]
    assert sorted(steps) == list(range(1, 22)), steps


# --- a collective broken under a rank by a peer that left at once ----------------------------------
def _broken_under(rank: int, port: int, folder: str, how: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from workbench.engine.monitor import RankMonitor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    monitor = RankMonitor(RunDir(folder), rank, 2).start()
    dist.barrier()
    if rank == 1:
        if how == "cancelled":
            RunDir(folder).mark_cancelled("a test, as Run.cancel marks it")
        else:
            monitor.fail(RuntimeError("rank 1 failed"))
        os._exit(0)  # its connections close at once, before rank 0's monitor could look
    with monitor.reporting():
        for _ in range(1000):
            dist.all_reduce(torch.ones(1))  # breaks under it: "Connection closed by peer"


@pytest.mark.parametrize("how", ["cancelled", "failed"])
def test_a_collective_broken_by_a_peer_that_left_at_once_says_why_that_peer_left(tmp_path, how):
    from workbench.engine.monitor import PEER_FAILED_EXIT_CODE

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_broken_under, args=(rank, port, str(tmp_path), how)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    run = RunDir(tmp_path)
    status = run.read_status(0) or {}
    events = [json.loads(line)["event"] for line in run.events(0).read_text().splitlines()]
    if how == "cancelled":  # a cancel stopped the peer: this rank was stopped by it too, not failed
        assert (status.get("state"), run.read_error(0)) == ("interrupted", None)
        assert "interrupted" in events and "error" not in events
    else:  # the peer failed: this rank stopped because of it, as when its monitor sees the failure first
        assert procs[0].exitcode == PEER_FAILED_EXIT_CODE
        assert (status.get("state"), run.read_error(0)) == ("aborted", None)
        assert "aborted" in events and "error" not in events
