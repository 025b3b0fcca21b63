"""%%ranks as a notebook user runs it (IPython's own shell, `%load_ext workbench`, a real 2-rank
gloo pool): a cell that raises shows the cell's frames first, no workbench frame, and one note on
how to see them all; with WORKBENCH_TRACEBACK=full the workbench's frames are there too."""

from __future__ import annotations

import re

import pytest

import workbench
from tests.support.lifecycle import assert_nothing_left, cfg
from workbench.engine.userframes import HIDDEN_NOTE

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]

CELL = "def parse(text):\n    return int(text)\nparse('x' * (rank + 1))"


def test_a_ranks_cell_that_raises_shows_the_users_frames_only(tmp_path, capfd, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "workbench")
        monkeypatch.delenv("WORKBENCH_TRACEBACK", raising=False)
        with workbench.Pool(cfg(tmp_path, max_steps=4, checkpoint_every_steps=None)) as pool:
            pool.wait_ready(180)
            shell.run_cell_magic("ranks", "", CELL)
            err = capfd.readouterr().err
            monkeypatch.setenv("WORKBENCH_TRACEBACK", "full")
            shell.run_cell_magic("ranks", "", CELL)
            full = capfd.readouterr().err
    finally:
        InteractiveShell.clear_instance()
    for rank in (0, 1):
        frames = re.findall(rf'^\[rank {rank}\]   File "([^"]+)"', err, re.M)
        assert frames == [f"<rank {rank} cell>"] * 2, err  # the cell, then parse(): nothing of the workbench's
        assert f"[rank {rank}] ValueError: invalid literal for int() with base 10: '{'x' * (rank + 1)}'" in err
    assert err.count(HIDDEN_NOTE.strip()) == 1, err
    assert "workbench/engine/warm.py" in full and HIDDEN_NOTE.strip() not in full
    assert_nothing_left(pool.dir.root)
