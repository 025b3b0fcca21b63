"""Errors raised by the user's own task factory, model or script: the rank's error file shows the
user's frames and hides the workbench's (WORKBENCH_TRACEBACK=full shows every frame); an error
the workbench raises about the user's input is its one line."""
from __future__ import annotations

import pytest

from tests.support.tasks_for_tests import wrong_return
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
    line = ("TypeError: task factory tests.support.tasks_for_tests.wrong_return returned int; return "
            "workbench.Task(model=..., train_dataset=..., loss_fn=...) or a dict with those keys")
    assert text.endswith(f"{line}\n{HIDDEN_NOTE}")
    assert all("test_user_errors.py" in f for f in _frames(text))  # the caller here; no workbench frame
    monkeypatch.setenv("WORKBENCH_TRACEBACK", "full")
    full = Run(tmp_path / "run").exception().traceback
    assert any("workbench/engine/tasks.py" in f for f in _frames(full)) and HIDDEN_NOTE not in full




