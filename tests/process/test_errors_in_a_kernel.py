"""User-facing errors in a real Jupyter kernel (nbclient, as JupyterLab runs a cell): one line, as the CLI says
it, not under the workbench's and submitit's frames; the full traceback one call away
(workbench.show_traceback()).  Notebook 03's SLURM message sat under about 60 lines of frames, and
compare(metrics=["val_los"]) was a bare ValueError with internal frames (issue 29)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support.runs import write_run
from workbench.runfolder.layout import RunDir, write_json_atomic

pytestmark = pytest.mark.timeout(240)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HINT = "(the full traceback: workbench.show_traceback())"


def _failed_run(root: Path) -> Path:
    folder = write_run(root, "failed", 2, "linear", final="failed")
    write_json_atomic(RunDir(folder).error(1), {
        "rank": 1, "type": "ValueError", "message": "injected failure on rank 1", "time": time.time(), "attempt": 0,
        "traceback": 'Traceback (most recent call last):\n  File "train.py", line 3, in loss_fn\nValueError: injected\n'})
    return folder


def _run_cells(cells: list[str], folder: Path, env: dict[str, str]) -> list[nbformat.NotebookNode]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(nb, kernel_name="python3", timeout=120, startup_timeout=120, allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)
    return [cell.outputs for cell in nb.cells]


def _error(outputs: list[nbformat.NotebookNode]) -> tuple[str, list[str]]:
    errors = [o for o in outputs if o.output_type == "error"]
    assert len(errors) == 1, outputs
    return errors[0].ename, [ANSI.sub("", line) for line in errors[0].traceback]


def test_user_errors_are_one_line_in_a_kernel_and_a_bug_keeps_its_traceback(tmp_path):
    failed = _failed_run(tmp_path)
    path_without_slurm = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                         if not (Path(p) / "sbatch").exists())
    env = {**os.environ, "PATH": path_without_slurm}
    cells = [
        "import workbench",
        "workbench.JobConfig.from_dict({'train': {'micro_batchsize': 8}})",
        "cfg = workbench.JobConfig.from_dict({'launch': {'executor': 'slurm', 'run_root': 'runs'}})\n"
        "workbench.submit(cfg)",
        f"workbench.compare([{str(failed)!r}], metrics=['val_los'])",
        f"workbench.Run.load({str(failed)!r}).result()",
        "raise workbench.SubmitError('run folder runs/x is in use by pid 1, still running; wait for it')",
        "workbench.show_traceback()",
        "import json\njson.loads('{')",  # not the workbench's error: Python's own traceback
    ]
    outputs = _run_cells(cells, tmp_path, env)
    assert not any(o.output_type == "error" for o in outputs[0]), outputs[0]

    name, lines = _error(outputs[1])
    assert name == "ConfigError" and lines == [
        "ConfigError: train.micro_batchsize: unknown key; did you mean 'micro_batch_size'?", HINT], lines
    name, lines = _error(outputs[2])
    assert name == "ConfigError" and len(lines) == 2 and "sbatch and sinfo on PATH" in lines[0], lines
    name, lines = _error(outputs[3])
    assert name == "ArgumentError" and lines[0].startswith("ArgumentError: metrics: 'val_los' was logged by none"), lines
    assert len(lines) == 2, lines
    name, lines = _error(outputs[4])
    assert name == "RunFailed" and len(lines) == 2, lines
    assert lines[0] == f"RunFailed: run {failed} failed: rank 1 (attempt 0) raised ValueError: injected failure on rank 1"
    assert lines[1].startswith("(rank 1's traceback: run.exception().traceback")
    name, lines = _error(outputs[5])
    assert name == "SubmitError" and lines == [
        "SubmitError: run folder runs/x is in use by pid 1, still running; wait for it", HINT], lines

    shown = "".join(o.get("text", "") for o in outputs[6] if o.output_type == "stream")
    assert shown.startswith("Traceback (most recent call last):") and "SubmitError: run folder runs/x" in shown, shown

    name, lines = _error(outputs[7])
    text = "\n".join(lines)
    assert name == "JSONDecodeError" and len(lines) > 2 and "json.loads('{')" in text, text
