"""The step logger reduces the losses of several logged steps at once (on a real one-rank gloo
group in this process), and the trainer's malloc settings step aside for the user's."""

from __future__ import annotations

import json
import platform

import pytest

from workbench.runfolder.layout import RunDir

pytestmark = pytest.mark.timeout(60)


def _written(monitor) -> list[dict]:
    """The records on disk so far (the writer flushes every line)."""
    path = monitor.run.metrics(0)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _logger(tmp_path, every_s: float):
    from workbench.engine.monitor import RankMonitor
    from workbench.engine.steplog import StepLogger

    monitor = RankMonitor(RunDir(tmp_path), 0, 1)
    return monitor, StepLogger(monitor, world_size=1, device="cpu", max_every=10, every_s=every_s)


def test_fast_steps_are_reduced_ten_at_a_time_and_every_record_is_written_once(one_rank_group, tmp_path):
    import torch

    monitor, logger = _logger(tmp_path, every_s=3600.0)  # any step is "fast": the cap decides
    for step in range(1, 26):
        logger.poll()
        logger.end_step(step, {"step": step, "loss": None}, torch.tensor(float(step)), stop=False)
        if step == 11:
            logger.flush()
            # step 1 and step 2 were reduced alone (no cadence known yet); 3..11 wait for step 12
            assert [r["step"] for r in _written(monitor)] == [1, 2]
            assert logger.every == 10
    logger.finish()
    records = _written(monitor)
    assert [r["step"] for r in records] == list(range(1, 26))
    assert all(r["loss"] == r["loss_reduced"] == float(r["step"]) for r in records)


def test_slow_steps_are_reduced_one_by_one(one_rank_group, tmp_path):
    import torch

    monitor, logger = _logger(tmp_path, every_s=0.0)  # every step is "slow"
    for step in range(1, 6):
        logger.end_step(step, {"step": step, "loss": None}, torch.tensor(2.0), stop=False)
        logger.flush()
        assert len(_written(monitor)) == step and logger.every == 1


def test_a_stop_asked_between_reduces_travels_with_the_next_one(one_rank_group, tmp_path):
    import torch

    _, logger = _logger(tmp_path, every_s=3600.0)
    seen = [logger.end_step(step, None, torch.tensor(1.0), stop=step == 5) for step in range(1, 40)]
    # reduces start at steps 1, 2, 12, 22, ...; the flag asked at step 5 rides on step 12's reduce,
    # whose verdict every rank reads at the reduce after it (step 22)
    assert [step for step, stop in zip(range(1, 40), seen) if stop] == [22]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_user_malloc_settings_are_left_alone(monkeypatch):
    from workbench.engine.trainer import MALLOC_ENV, keep_freed_memory

    for name in MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    assert keep_freed_memory() is True
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert keep_freed_memory() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")
    assert keep_freed_memory() is False


# --- a rank that ends early writes what it held ---------------------------------------------------
def test_records_held_for_a_reduce_are_written_when_the_monitor_closes(one_rank_group, tmp_path):
    """The failure paths (a raise, SIGTERM: RankMonitor.reporting -> close) write the records kept
    for the next reduce, with this rank's loss; a reduce that completed gives its mean too."""
    import torch

    monitor, logger = _logger(tmp_path, every_s=3600.0)
    for step in range(1, 8):  # reduces start at steps 1 and 2; 3..7 wait for step 12's
        logger.end_step(step, {"step": step, "loss": None}, torch.tensor(float(step)), stop=False)
    logger._pending.handle.wait()  # step 2's reduce has completed but was not written yet
    assert [r["step"] for r in _written(monitor)] == [1]
    monitor.close("failed")
    records = _written(monitor)
    assert [r["step"] for r in records] == list(range(1, 8))
    assert all(r["loss"] == float(r["step"]) for r in records)
    assert [r["step"] for r in records if "loss_reduced" in r] == [1, 2]  # reduced before the end
    logger.end_step(8, {"step": 8, "loss": None}, torch.tensor(8.0), stop=False)
    logger.write_held()
    assert len(_written(monitor)) == 7, "nothing is written after the end"

