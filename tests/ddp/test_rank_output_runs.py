"""Each rank's output where people look: live in the terminal, prefixed [rank N], filtered like
torchrun's --local-ranks-filter; the launcher's own lines left out."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import SCRIPTS

pytestmark = pytest.mark.timeout(120)



CHATTY = SCRIPTS / "chatty.py"



@pytest.mark.ddp
def test_the_terminal_shows_the_chosen_ranks_output_live(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2", "--ranks", "1",
                           "--set", f"launch.run_root={tmp_path}", str(CHATTY)],
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("[rank")] == [f"[rank 1] still working {i}" for i in range(8)]
    assert "no metrics logged; 16 lines of output" in lines[-2] and "submitit INFO" not in proc.stdout
    assert lines[-1].startswith("[workbench] next: `workbench show ")  # what to do next, last

