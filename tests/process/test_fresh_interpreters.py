"""What a fresh interpreter imports: `import workbench` stays light (no torch, no ipywidgets, no
submitit); without ipywidgets the widgets say how to install them; a rank says "starting" before
torch is imported."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support import REPO
from tests.support.runs import run_folder
from workbench.launch.run import Run

pytestmark = pytest.mark.timeout(30)


def test_construction_does_not_import_torch():
    code = ("import sys, workbench; workbench.JobConfig.from_dict({'train': {'lr': 1e-3}}); "
            "workbench.JobConfig(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_import_workbench_is_light():
    code = ("import sys, workbench; heavy = [m for m in ('torch', 'submitit', 'ipywidgets', 'matplotlib') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)



@pytest.mark.timeout(150)
def test_import_workbench_does_not_import_ipywidgets():
    result = run_python("""
        import sys
        import workbench
        workbench.JobConfig(), workbench.Run, workbench.submit
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ipywidgets", "workbench.ui")))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"



@pytest.mark.timeout(150)
def test_without_ipywidgets_ui_import_says_how_to_install_and_plot_still_works(tmp_path):
    result = run_python(f"""
        import sys
        sys.modules["ipywidgets"] = None  # as if it were not installed
        from pathlib import Path
        from workbench.launch.run import Run
        from workbench.runfolder.layout import RunDir, write_json_atomic
        from workbench.runfolder.writer import JsonlWriter

        run_dir = RunDir(Path({str(tmp_path / "run")!r})).create()
        write_json_atomic(run_dir.meta, {{"world_size": 2}})
        for rank in range(2):
            writer = JsonlWriter(run_dir.metrics(rank))
            for step in range(1, 6):
                writer.write({{"rank": rank, "step": step, "loss": 1.0 / step, "loss_reduced": 1.0 / step,
                               "step_time_s": 0.1, "samples_per_s": 320.0, "mem_mb": 100.0}})
            writer.close()
        fig = Run(run_dir.root).plot()
        from matplotlib.figure import Figure
        print("Figure" if isinstance(fig, Figure) else type(fig).__name__)  # a Figure that shows itself
        try:
            import workbench.ui
        except ImportError as exc:
            print("ImportError:", exc)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "Figure"
    assert lines[1].startswith("ImportError:") and 'pip install "workbench[lab]"' in lines[1]





def test_a_rank_says_starting_before_torch_is_imported(tmp_path):
    run = run_folder(tmp_path, world=2, steps=0)
    run.status(1).unlink()
    code = f"""
import sys, submitit
import workbench.engine.entry as entry
class Env:
    global_rank = 1
submitit.JobEnvironment = Env
entry._announce({str(run.root)!r})
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # it said so before the slow import
    status = json.loads(run.status(1).read_text())
    assert status["state"] == "starting" and status["rank"] == 1
    assert Run.load(run.root).status().ranks[1].state == "starting"

