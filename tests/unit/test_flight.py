"""Which collective: the flight recorder's entries as a rank reads them (engine.flight) and the verdicts
drawn from the ranks' statuses (engine.hang.mismatch, never_entered): pure logic on records made here.
What torch records in a real gloo group is tested in tests/ddp/test_hang_shapes.py."""

from __future__ import annotations

import pytest

from workbench.engine.flight import BUFFER_ENV, op_name, recorder_env
from workbench.engine.hang import mismatch, never_entered

pytestmark = pytest.mark.timeout(30)


def _at(seq: int, op: str = "all_reduce", sizes: str = "[[10]]", done: bool = False, where: str = "") -> dict:
    return {"collective": op, "collective_seq": seq, "collective_sizes": sizes, "collective_done": done,
            "where": where}


def test_a_rank_stuck_before_the_collective_its_peers_wait_in_never_entered_it():
    peers = {0: _at(21)}
    assert never_entered(1, _at(20, done=True), peers) == (
        " (all_reduce #21, which rank 1 never entered; its last was all_reduce #20)")
    assert never_entered(1, None, peers) == " (all_reduce #21, which rank 1 never entered; it entered none)"
    assert never_entered(1, _at(21), peers) == " (all_reduce #21)"  # it entered, and is stuck after (its own thread)
    assert never_entered(1, None, {0: {"waiting": True}}) == ""  # no recorder: the words stay as they were


def test_ranks_in_different_collectives_at_the_same_number_name_the_odd_one_with_every_rank_where():
    culprit, what = mismatch({0: _at(21, where="a.py:3 in step"), 1: _at(21, "barrier", "[]", where="a.py:9 in step"),
                              2: _at(21)})
    assert culprit == 1
    assert what == ("ranks in different collectives at the same number #21: "
                    "rank 0 in all_reduce #21 of sizes [[10]] at a.py:3 in step; "
                    "rank 1 in barrier #21 of sizes [] at a.py:9 in step; rank 2 in all_reduce #21 of sizes [[10]]")
    assert mismatch({0: _at(21), 1: _at(21, "barrier")})[0] == 1  # a tie: rank 0's collective is the reference


def test_mismatched_sizes_and_numbers_are_said_and_agreement_is_no_verdict():
    culprit, what = mismatch({0: _at(7, sizes="[[10]]"), 1: _at(7, sizes="[[20]]")})
    assert culprit == 1 and what.startswith("mismatched sizes in all_reduce #7: ")
    culprit, what = mismatch({0: _at(8), 1: _at(7)})
    assert culprit == 1 and what.startswith("ranks in different collectives: rank 0 in all_reduce #8")
    assert mismatch({0: _at(7), 1: _at(7)}) is None  # all in one collective: a lost or stopped peer, not a mismatch


def test_the_recorder_is_on_in_every_rank_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv(BUFFER_ENV, raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert int(recorder_env()[BUFFER_ENV]) > 0
    monkeypatch.setenv(BUFFER_ENV, "0")
    assert recorder_env() == {BUFFER_ENV: "0"}
    assert op_name("gloo:all_reduce") == "all_reduce" and op_name("nccl:_reduce_scatter_base") == "reduce_scatter_base"


def test_only_the_forked_workers_of_the_iterator_the_main_thread_waits_on_are_signalled():
    """A spawned or forkserver worker has no dump handler: the signal would end it, so it is left alone."""
    import sys

    from workbench.engine.loaderstacks import loader_workers

    forked = type("Popen", (), {"__module__": "multiprocessing.popen_fork"})
    spawned = type("Popen", (), {"__module__": "multiprocessing.popen_spawn_posix"})

    def worker(pid: int, popen: type) -> object:
        return type("Process", (), {"pid": pid, "_popen": popen()})()

    class _MultiProcessingDataLoaderIter:  # noqa: N801 - torch's name, which loader_workers looks for
        _workers = [worker(11, forked), worker(12, spawned), worker(13, forked)]

    def _get_data(self):  # the frame torch's iterator waits in
        return loader_workers(sys._getframe())

    assert _get_data(_MultiProcessingDataLoaderIter()) == [11, 13]
    assert loader_workers(sys._getframe()) == []  # not waiting on a DataLoader
