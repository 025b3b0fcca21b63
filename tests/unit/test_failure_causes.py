"""The one rule that names a run's failure (workbench.runfolder.causes) and the hang helpers the
ranks' heartbeat uses (workbench.engine.hang): pure logic on records made here."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from workbench.engine.hang import (
    STALL_FLOOR_S,
    STARTUP_STALL_S,
    StallLimit,
    Stuck,
    hung_message,
    stack_shape,
    stuck,
    where_is,
)
from workbench.launch.run import Run
from workbench.runfolder.causes import RankFailure, cause_of, from_record, stopped_because
from workbench.runfolder.layout import RunDir, write_json_atomic

pytestmark = pytest.mark.timeout(60)

RESET = "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:10113"
TIMEOUT = "[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv operation to complete"


def failure(rank, kind, message, at, attempt=0):
    return RankFailure(rank, kind, message, "", "node", attempt, at)


def test_the_earliest_failure_is_the_cause_and_the_rest_are_its_consequences():
    cause = cause_of([failure(0, "ValueError", "second", 2.0), failure(1, "KeyError", "'first'", 1.0)])
    assert (cause.rank, cause.type) == (1, "KeyError")
    assert [(f.rank, f.type) for f in cause.consequences] == [(0, "ValueError")]  # both errors are kept
    assert str(cause) == "rank 1 (node, attempt 0) raised KeyError: 'first'"
    assert cause.consequence_lines() == ["then rank 0 (node, attempt 0) raised ValueError: second"]


def test_a_knock_on_error_written_first_is_never_the_cause():
    """A killed agent: the peer's reset is written before the death is noticed; the death is the cause."""
    reset = failure(0, "RuntimeError", RESET, 10.0)
    killed = RankFailure(1, "Lost", "rank 1's agent (pid 7) was killed by SIGKILL", "", "node", 0, 10.2,
                         reported_by="controller")
    cause = cause_of([reset, killed])
    assert cause.rank == 1 and cause.type == "Lost"
    assert cause.consequence_lines() == [f"then rank 0 (node, attempt 0) raised RuntimeError: {RESET} (a consequence)"]
    assert str(cause) == "rank 1 (node, attempt 0): rank 1's agent (pid 7) was killed by SIGKILL"


@pytest.mark.parametrize("kind, message", [
    ("RuntimeError", RESET), ("RuntimeError", TIMEOUT), ("DistBackendError", "NCCL error"),
    ("RuntimeError", "[c10d] Connection reset by peer"), ("RuntimeError", "Broken pipe"),
    ("DistStoreError", "Socket Timeout"),
    ("RuntimeError", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"),
    ("Aborted", "stopped because rank 1 failed")])
def test_words_of_a_broken_collective_are_knock_on(kind, message):
    assert failure(0, kind, message, 0.0).knock_on


@pytest.mark.parametrize("kind, message", [("ValueError", "bad shape"), ("OutOfMemoryError", "CUDA out of memory"),
                                           ("Lost", "rank 1's process was killed by SIGKILL"),
                                           ("TimeoutError", "the dataset server did not answer")])
def test_the_users_own_errors_are_not_knock_on(kind, message):
    assert not failure(0, kind, message, 0.0).knock_on


def test_only_knock_on_errors_the_earliest_is_the_cause():
    cause = cause_of([failure(1, "RuntimeError", TIMEOUT, 5.0), failure(0, "RuntimeError", RESET, 4.0)])
    assert cause.rank == 0 and len(cause.consequences) == 1
    assert cause_of([]) is None


def test_a_record_of_a_rank_already_gone_is_dated_by_its_last_sign_of_life():
    lost = from_record(1, {"rank": 1, "type": "Lost", "message": "rank 1 sent no heartbeat for 61 s",
                           "time": 100.0, "last_seen": 39.0, "reported_by": 0, "attempt": 2})
    assert (lost.time, lost.reported_by, lost.attempt) == (39.0, "rank 0", 2)
    raised = failure(0, "ValueError", "later", 50.0)
    assert cause_of([raised, lost]).rank == 1


def test_a_rank_that_stopped_because_of_the_cause_says_so():
    hung = RankFailure(1, "Hung", "rank 1 hung: no progress for 12 s, at train.py:9 in loss_fn", "", "n", 0, 1.0)
    waiting = stopped_because(hung, 0, waiting=True)
    assert waiting.knock_on and "waiting for rank 1 in a collective" in waiting.message
    assert str(hung) == "rank 1 (n, attempt 0): rank 1 hung: no progress for 12 s, at train.py:9 in loss_fn"
    controller = RankFailure(-1, "ControllerLost", "the local controller (pid 5) was killed by SIGKILL", "")
    assert str(controller) == "the local controller (pid 5) was killed by SIGKILL"  # not "...controller: the local..."
    assert stopped_because(controller, 0, waiting=False).message == "stopped because the local controller was lost"


def test_a_damaged_error_file_reads_as_absent_in_exception(tmp_path):
    run = RunDir(tmp_path / "run").create()
    write_json_atomic(run.meta, {"world_size": 2, "executor": "local"})
    run.error(0).write_text("{not json")
    write_json_atomic(run.error(1), {"rank": 1, "type": "ValueError", "message": "real", "traceback": "",
                                     "time": time.time(), "attempt": 0})
    with pytest.warns(Warning, match="rank0.json"):
        found = Run(run.root).exception()
    assert (found.rank, found.type) == (1, "ValueError") and not found.consequences


def test_failures_and_exception_agree_on_the_cause(tmp_path):
    """Both ranks raised: each keeps its error; every view names the same cause."""
    run = RunDir(tmp_path / "run").create()
    write_json_atomic(run.meta, {"world_size": 2, "executor": "local"})
    now = time.time()
    write_json_atomic(run.error(0), {"rank": 0, "type": "RuntimeError", "message": RESET, "time": now - 1,
                                     "attempt": 0})
    write_json_atomic(run.error(1), {"rank": 1, "type": "Lost", "message": "rank 1's process was killed by SIGKILL",
                                     "time": now, "attempt": 0, "reported_by": "agent"})
    handle = Run(run.root)
    assert handle.exception().rank == 1
    assert [(f.rank, [c.rank for c in f.consequences]) for f in handle.failures()] == [(1, [0])]


def test_the_stall_limit_follows_the_jobs_pace_with_a_floor():
    limit = StallLimit()
    assert limit.seconds == STARTUP_STALL_S  # before the first step: imports, downloads, compilation
    limit.saw_step(1, 100.0)
    limit.saw_step(1, 101.0)
    limit.saw_step(2, 102.0)  # 2 s between steps
    assert limit.seconds == STALL_FLOOR_S
    limit.saw_step(3, 122.0)  # one step took 20 s (an eval): ten times that
    assert limit.seconds == 200.0
    assert limit.naming_seconds == 200.0


def test_a_stall_limit_the_user_set_holds_from_the_start():
    """A script that hangs before its first step (no workbench.log, or a rank stuck in its first batch) is
    named after the number the user set, not after STARTUP_STALL_S (300 s, seen in a trial)."""
    fixed = StallLimit(fixed_s=20.0)
    assert fixed.seconds == fixed.naming_seconds == 20.0
    fixed.saw_step(1, 10.0)
    assert fixed.naming_seconds == 20.0
    assert StallLimit().naming_seconds == STARTUP_STALL_S  # the automatic limit waits for a first step


def test_before_its_first_step_a_rank_whose_stack_moves_is_at_work_not_hung():
    """DDP's constructor imports torch._dynamo and sympy (800 modules, 8 s on a loaded machine) while the
    peers wait in its broadcast: with a user's limit of 3 s that rank was named hung at `DDP(model)` (seen in
    CI, the SLURM hang test).  Before the first step only a stack that stood still for the limit names it."""
    fixed = StallLimit(fixed_s=3.0)
    moving = Stuck(silent_s=8.0, waiting=False, where="train.py:22 in <module>", still_s=0.5)
    still = Stuck(silent_s=8.0, waiting=False, where="train.py:30 in loss_fn", still_s=8.0)
    assert not fixed.names(moving) and fixed.names(still)
    assert fixed.names(Stuck(STARTUP_STALL_S + 1, False, "", still_s=0.5)), "a moving stack is named in the end"
    assert not fixed.names(Stuck(2.0, False, "", still_s=2.0)), "never before the limit"
    fixed.saw_step(1, 10.0)
    assert fixed.names(moving), "after the first step the limit alone names it"
    automatic = StallLimit()
    assert not automatic.names(still) and automatic.names(Stuck(STARTUP_STALL_S + 1, False, "", STARTUP_STALL_S + 1))


def _sleeps(ready, release):
    ready.set()
    while not release.is_set():
        time.sleep(0.01)  # a loop that never returns: the same functions on the stack at every look


def _imports(folder, ready, release):
    import importlib

    sys.path.insert(0, str(folder))
    ready.set()
    for n in range(10_000):  # work in ever other functions, as an import of torch._dynamo is
        if release.is_set():
            return
        (folder / f"wb_fresh_{n}.py").write_text("import textwrap\n" + "".join(
            f"def f{i}(x):\n    return textwrap.indent(str(x), ' ')\n" for i in range(50)))
        importlib.import_module(f"wb_fresh_{n}")


def test_the_stack_shape_stands_still_in_a_loop_and_moves_while_importing(tmp_path):
    shapes = {}
    for target, args in ((_sleeps, ()), (_imports, (tmp_path,))):
        ready, release = threading.Event(), threading.Event()
        thread = threading.Thread(target=target, args=(*args, ready, release), daemon=True)
        thread.start()
        ready.wait(5)
        seen = set()
        for _ in range(20):
            seen.add(stack_shape(sys._current_frames().get(thread.ident)))
            time.sleep(0.02)
        release.set()
        thread.join(10)
        shapes[target.__name__] = len(seen)
    sys.path.remove(str(tmp_path))
    assert shapes["_sleeps"] == 1 and shapes["_imports"] > 1, shapes


def test_a_wait_the_engine_marks_is_a_collective_wherever_its_code_is():
    """The engine's comm hook and loss reduce wait in C calls made from workbench's own files: by path alone
    the waiting rank looked stuck in workbench code, and the hung one was never named (issue 28)."""
    import sys

    from workbench.engine.hang import in_collective

    here = sys._getframe()
    assert where_is(here)[0] is False  # a test's own frame: user code, not a collective
    with in_collective("all_reduce (gradients)"):
        assert where_is(here)[0] is True
    assert where_is(here)[0] is False


def _stuck_in_user_code(ready, release):
    ready.set()
    release.wait()  # stdlib below this frame: the user's frame is this one


def test_where_a_thread_is_stuck_names_the_users_frame():
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_stuck_in_user_code, args=(ready, release))
    thread.start()
    try:
        ready.wait(5)
        waiting, where = where_is(sys._current_frames()[thread.ident])
        assert not waiting and "test_failure_causes.py:" in where and where.endswith("in _stuck_in_user_code")
        found = stuck(12.0, StallLimit(fixed_s=5.0), sys._current_frames()[thread.ident])
        assert found is not None and not found.waiting
        assert stuck(4.0, StallLimit(fixed_s=5.0), None) is None
        assert hung_message(1, found, [0]).startswith("rank 1 hung: no progress for 12 s, at ")
        assert hung_message(1, found, [0]).endswith("; rank 0 waits for it in a collective")
    finally:
        release.set()
        thread.join()


def test_the_dashboard_shows_the_cause_and_what_followed():
    from workbench.ui.state import failure_text

    cause = cause_of([failure(1, "ValueError", "bad", 1.0), failure(0, "RuntimeError", RESET, 1.1)])
    text = failure_text(cause)
    assert text.startswith("rank 1 (node, attempt 0) raised ValueError: bad\n  then rank 0 (node, attempt 0)")
    assert "(a consequence)" in text


GLOO_ABORT = """[rank0] step 6
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] \
op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size. Is there a distributed \
collective mismatch in your code?
Fatal Python error: Aborted

Thread 0x00007f61d67146c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/site/workbench/engine/monitor.py", line 220 in _beat

Thread 0x00007f61f88a9b80 (most recent call first):
  File "/site/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/home/me/train.py", line 18 in step
  File "/home/me/train.py", line 40 in main
  File "/site/workbench/engine/worker.py", line 110 in run_job

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""


def test_a_native_crash_is_read_for_what_native_code_said_and_the_users_innermost_line():
    from workbench.runfolder.failures import native_crash

    def users(name: str) -> bool:
        return name.startswith("/home/me/")

    what, where = native_crash(GLOO_ABORT, users)
    assert what.startswith("gloo::EnforceNotMet: [enforce fail at ") and what.endswith("mismatch in your code?")
    assert where == "/home/me/train.py:18 in step"
    segfault = GLOO_ABORT.split("Fatal Python error:")[1].replace("Thread 0x00007f61f88a9b80", "Current thread 0x1")
    assert native_crash("Fatal Python error: Segmentation fault" + segfault, users) == ("", where)  # no C++ words
    assert native_crash("Traceback (most recent call last):\n  File \"/home/me/train.py\", line 3", users) == ("", "")
