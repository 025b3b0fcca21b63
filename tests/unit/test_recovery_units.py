"""Recovery logic without processes: a lost neighbour, a corrupt checkpoint, a reused run folder."""

from __future__ import annotations

import time

import pytest
import torch

from workbench.config import JobConfig
from workbench.engine.checkpoint import load_latest, save_checkpoint
from workbench.engine.monitor import RankMonitor
from workbench.runfolder.layout import RunDir, read_json, write_json_atomic

pytestmark = pytest.mark.timeout(30)


def test_a_silent_neighbour_is_reported_lost(tmp_path):
    run = RunDir(tmp_path).create()
    monitor = RankMonitor(run, rank=0, world_size=2)
    write_json_atomic(run.status(1), {"rank": 1, "state": "running", "step": 7, "time": time.time() - 120})
    monitor._watch_neighbour()
    error = read_json(run.error(1))
    assert error["type"] == "Lost" and "rank 1 sent no heartbeat" in error["message"]
    assert monitor.failed_peers() == [1]  # which makes every rank stop


def test_a_live_or_finished_neighbour_is_left_alone(tmp_path):
    run = RunDir(tmp_path).create()
    monitor = RankMonitor(run, rank=0, world_size=2)
    write_json_atomic(run.status(1), {"rank": 1, "state": "running", "time": time.time()})
    monitor._watch_neighbour()
    write_json_atomic(run.status(1), {"rank": 1, "state": "finished", "time": time.time() - 999})
    monitor._watch_neighbour()
    assert not run.error(1).exists()


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    run = RunDir(tmp_path).create()
    save_checkpoint(run, 10, {"step": 10, "w": torch.ones(3)}, keep=3)
    latest = save_checkpoint(run, 20, {"step": 20, "w": torch.ones(3)}, keep=3)
    latest.write_bytes(latest.read_bytes()[:50])  # truncated by a crash
    path, state = load_latest(run)
    assert state["step"] == 10 and path.name == "step-00000010.pt"


def test_reusing_a_run_folder_forgets_the_last_attempts_end(tmp_path):
    cfg = JobConfig()
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    write_json_atomic(run.error(1), {"rank": 1})
    write_json_atomic(run.status(1), {"rank": 1, "state": "failed"})
    write_json_atomic(run.summary, {"status": "finished"})
    write_json_atomic(run.meta, {**read_json(run.meta), "cancelled": 1.0})
    (run.metrics(0)).write_text('{"step": 1}\n')
    RunDir(run.root).prepare(cfg, "local")
    assert not run.error(1).exists() and not run.status(1).exists() and not run.summary.exists()
    assert "cancelled" not in read_json(run.meta)
    assert run.metrics(0).read_text() == '{"step": 1}\n'  # metrics stay


def test_a_notebook_task_label_without_the_task_is_a_clear_error(tmp_path):
    import workbench
    from workbench.errors import ConfigError

    cfg = JobConfig.from_dict({"task": {"name": "<__main__.make_task>"}, "launch": {"run_root": str(tmp_path)}})
    with pytest.raises(ConfigError, match="task.name: <__main__.make_task> was a Python object"):
        workbench.submit(cfg)
    assert not any(tmp_path.iterdir())




@pytest.mark.parametrize("bad", ["1,x", "0,2", ""])
def test_bad_world_sizes_name_the_option(tmp_path, capsys, bad):
    from workbench.cli import main

    path = tmp_path / "job.yaml"
    JobConfig().to_yaml(path)
    assert main(["table", str(path), "--world-sizes", bad]) == 2
    assert "--world-sizes" in capsys.readouterr().err


class _Payload:
    """What a hostile checkpoint would hold: unpickling it runs a command."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_not_run(tmp_path):
    run = RunDir(tmp_path / "run").create()
    marker = tmp_path / "it-ran"
    torch.save({"step": 3, "model": _Payload(str(marker))}, run.checkpoint(3))
    from workbench.engine.checkpoint import NoReadableCheckpoint

    with pytest.raises(NoReadableCheckpoint, match="step-00000003.pt: UnpicklingError"):
        load_latest(run)  # torch.load(weights_only=True) refuses it: the command never runs
    assert not marker.exists()


def test_down_marks_are_per_meeting_and_rank_and_a_peers_mark_makes_a_rank_follow(tmp_path):
    """The regroup barrier's marks (engine.supervisor) and a pool's next generation (engine.warm):
    one rank down for a meeting is seen by its peers, not by another meeting."""
    from workbench.engine.supervisor import Supervisor

    run = RunDir(tmp_path / "run")
    key, other = RunDir.start_key("41", 0), RunDir.start_key("41", 1)
    assert run.ranks_down(key, 3) == set()
    run.mark_down(key, 2)
    assert run.ranks_down(key, 3) == {2} and run.ranks_down(other, 3) == set()
    assert run.ranks_down(key, 2) == set(), "a rank beyond the world is not one of its ranks"
    follows = [Supervisor(rank, 3, lambda: False) for rank in range(3)]
    assert [sup.regrouping(run, key) for sup in follows] == [True, True, False], "a rank's own mark is not a peer's"
