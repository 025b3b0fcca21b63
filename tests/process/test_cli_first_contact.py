"""A terminal user's first mistakes, in fresh `workbench` processes: a factory that does not exist or
does not take the config's options is one line and exit 2 before any rank starts (no run folder),
and `--executor slurm --set dist.nodes=2` is judged as the SLURM job it asks for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.timeout(120)

QUICKSTART = str(REPO / "examples" / "quickstart.yaml")


def _workbench(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["workbench", *args], cwd=cwd, capture_output=True, text=True, timeout=100,
                          env={**os.environ, **env})


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: "), done.stderr
    return lines[0]


def test_run_with_a_missing_factory_or_options_it_does_not_take_fails_at_once(tmp_path):
    (tmp_path / "my_tasks.py").write_text("def make(width, depth=2):\n    raise AssertionError('not called')\n")
    missing = tmp_path / "missing.yaml"
    missing.write_text("task: {name: 'my_tasks:mkae'}\nlaunch: {run_root: runs}\n")
    line = _one_line(_workbench(["run", str(missing)], tmp_path, PYTHONPATH=str(tmp_path)))
    assert line == "workbench: task.name: my_tasks:mkae: module my_tasks has no mkae; check the name after the colon"
    unbound = tmp_path / "unbound.yaml"
    unbound.write_text("task: {name: 'my_tasks:make', options: {width: 8, n_train: 64}}\nlaunch: {run_root: runs}\n")
    line = _one_line(_workbench(["run", str(unbound)], tmp_path, PYTHONPATH=str(tmp_path)))
    assert line.startswith("workbench: task.options: make() does not take n_train (it takes depth, width)")
    assert not list(tmp_path.glob("runs/*/run.json")), "a run folder was made before the factory was checked"


def test_set_and_executor_are_validated_together(tmp_path):
    no_slurm = str(Path(sys.executable).parent)  # this Python's own commands, and no SLURM client
    line = _one_line(_workbench(["run", QUICKSTART, "--executor", "slurm", "--set", "dist.nodes=2"], tmp_path,
                                PATH=no_slurm))
    assert line == ("workbench: launch.executor: slurm needs sbatch and sinfo on PATH; run from a cluster login node "
                    "or use executor: local")  # not "dist.nodes: local runs use one machine"


def test_run_with_fsdp_units_the_model_lacks_is_one_line_before_anything_starts(tmp_path):
    """The built-in task from YAML and --set: the model is built on the meta device at submit, nothing starts."""
    line = _one_line(_workbench(["run", QUICKSTART, "--set", "dist.strategy=fsdp2", "--set", "dist.fsdp_units=[Nope]",
                                 "--set", f"launch.run_root={tmp_path / 'runs'}"], tmp_path))
    assert line == ("workbench: dist.fsdp_units: the model has no Nope; its module classes are Dropout, Linear, ReLU, "
                    "Sequential; list some of those, or leave it empty for its repeated blocks")
    assert not (tmp_path / "runs").exists(), "a run folder was made before the model was checked"
    checked = _workbench(["check", QUICKSTART, "--set", "dist.strategy=fsdp2", "--set", "dist.fsdp_units=[Nope]"],
                         tmp_path)
    assert _one_line(checked) == line
