"""Errors raised by the user's own task factory, model or script: the rank's error file shows the
user's frames and hides the workbench's (WORKBENCH_TRACEBACK=full shows every frame); an error
the workbench raises about the user's input is its one line."""
from __future__ import annotations

import pytest

from tests.support.runs import fail_building, frame_lines
from tests.support.tasks_for_tests import wrong_return
from workbench.engine.userframes import HIDDEN_NOTE
from workbench.launch.run import Run

pytestmark = pytest.mark.timeout(60)









def test_a_factory_returning_the_wrong_thing_hides_the_workbench_frames(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
    text = fail_building(tmp_path, wrong_return).exception().traceback
    line = ("TypeError: task factory tests.support.tasks_for_tests.wrong_return returned int; return "
            "workbench.Task(model=..., train_dataset=..., loss_fn=...) or a dict with those keys")
    assert text.endswith(f"{line}\n{HIDDEN_NOTE}")
    assert all("tests/support/runs.py" in f for f in frame_lines(text))  # the caller (fail_building); no workbench frame
    monkeypatch.setenv("WORKBENCH_TRACEBACK", "full")
    full = Run(tmp_path / "run").exception().traceback
    assert any("workbench/engine/tasks.py" in f for f in frame_lines(full)) and HIDDEN_NOTE not in full




