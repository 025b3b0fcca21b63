"""Errors raised by the user's own task factory, model or script: the rank's error file shows the
user's frames and hides the workbench's (WORKBENCH_TRACEBACK=full shows every frame); an error
the workbench raises about the user's input is its one line."""

from __future__ import annotations

import pytest

from tests.tasks_for_tests import raising_inside, wrong_return
from workbench.config import JobConfig
from workbench.engine.monitor import RankMonitor
from workbench.engine.tasks import build_task
from workbench.engine.userframes import HIDDEN_NOTE
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir

pytestmark = pytest.mark.timeout(60)


def _fail_building(tmp_path, factory) -> Run:
    cfg = JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local")
    monitor = RankMonitor(run, 0, 1).start()
    with pytest.raises((TypeError, KeyError)), monitor.reporting():  # what run_rank does around the task
        build_task(factory, {})
    return Run(run.root)


def _frames(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]


def test_a_factory_returning_the_wrong_thing_hides_the_workbench_frames(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
    text = _fail_building(tmp_path, wrong_return).exception().traceback
    line = ("TypeError: task factory tests.tasks_for_tests.wrong_return returned int; return "
            "workbench.Task(model=..., train_dataset=..., loss_fn=...) or a dict with those keys")
    assert text.endswith(f"{line}\n{HIDDEN_NOTE}")
    assert all("test_user_errors.py" in f for f in _frames(text))  # the caller here; no workbench frame
    monkeypatch.setenv("WORKBENCH_TRACEBACK", "full")
    full = Run(tmp_path / "run").exception().traceback
    assert any("workbench/engine/tasks.py" in f for f in _frames(full)) and HIDDEN_NOTE not in full


def test_an_error_in_the_factory_shows_the_users_frames(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
    text = _fail_building(tmp_path, raising_inside).exception().traceback
    frames = _frames(text)
    assert "tests/tasks_for_tests.py" in frames[-1] and "raising_inside" in frames[-1]
    assert not any("/workbench/" in f for f in frames)
    assert text.splitlines()[-2] == "KeyError: 'hiden'" and text.endswith(HIDDEN_NOTE)


@pytest.mark.ddp
@pytest.mark.parametrize("task, expected", [
    ({"name": "tests.tasks_for_tests:wrong_return"},
     "TypeError: task factory tests.tasks_for_tests.wrong_return returned int; return workbench.Task(model=..., "
     "train_dataset=..., loss_fn=...) or a dict with those keys"),
    ({"name": "synthetic", "options": {"n_train": 8}},
     "workbench.config.types.ConfigError: train.micro_batch_size: the training set has 8 samples but one "
     "optimizer step needs 16 (micro_batch_size x grad_accum_steps x world_size); lower micro_batch_size or "
     "grad_accum_steps, or use fewer ranks"),
])
def test_in_a_real_rank_the_users_mistake_is_its_one_line(tmp_path, task, expected):
    """One rank under the torchrun entry (a real process, a gloo group of one): its error file holds
    the one line, no framework frames before it."""
    import os
    import subprocess
    import sys

    cfg = JobConfig.from_dict({"task": task, "train": {"micro_batch_size": 16}, "dist": {"procs_per_node": 1},
                               "launch": {"run_root": str(tmp_path)}})
    cfg.to_yaml(tmp_path / "job.yaml")
    from workbench.engine.rendezvous import free_port

    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    env.pop("WORKBENCH_TRACEBACK", None)
    done = subprocess.run([sys.executable, "-m", "workbench.train", str(tmp_path / "job.yaml"), "--run-dir",
                           str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    failure = Run(tmp_path / "run").exception()
    assert failure.traceback == f"{expected}\n{HIDDEN_NOTE}"
