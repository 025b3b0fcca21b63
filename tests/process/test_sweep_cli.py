"""`workbench sweep` with bad input, as a user types it (fresh interpreters): one `workbench:` line
naming the flag or field and the fix, exit 2, and no sweep folder made."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.lifecycle import CLI

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("args, words", [
    (["--grid", "train.lrr=1e-3,3e-3"], ["train.lrr: unknown key", "did you mean 'lr'"]),
    (["--grid", "train.lr=1e-3,fast"], ["train.lr: expected a number", "fast"]),
    (["--grid", "train.lr"], ["--grid 'train.lr'", "FIELD=VALUE"]),
    (["--search", "train.lr=loguniform(1e-2,1e-4)"], ["loguniform(0.01, 0.0001)", "low < high"]),
    (["--search", "train.lr=loguniform(1e-4,1e-2)"], ["trials: a space with a distribution needs trials=N"]),
    ([], ["--grid: give at least one swept field"]),
    (["--grid", "train.lr=1e-3", "--prune", "sometimes"], ["pruner: 'sometimes' is not one of"]),
])
def test_a_bad_sweep_is_one_line_and_exit_2(tmp_path, args, words):
    config = tmp_path / "base.yaml"
    config.write_text(f"launch: {{run_root: {tmp_path / 'runs'}}}\n")
    done = subprocess.run([*CLI, "sweep", str(config), *args], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: "), done.stderr
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, words", [
    (["--script", "{tmp}/nope.py", "--grid", "args.lr=1e-3"], ["script: {tmp}/nope.py does not exist"]),
    (["--grid", "args.lr=1e-3,1e-2"], ["space['args.lr']: args.* fields are a swept script's options (--lr)",
                                       "workbench sweep --script train.py"]),
    (["--script", "{tmp}/train.py", "--grid", "train.lr=1e-3"], ["a script does not read the train section",
                                                                  "'args.lr' (--lr)"]),
    (["--grid", "train.lr=1e-3", "--", "--epochs", "1"], ["-- --epochs 1: arguments after -- are a swept script's",
                                                          "--script train.py"]),
    (["--resume", "{tmp}", "--", "--epochs", "1"], ["a resumed sweep runs its script with the arguments it was made"]),
    (["-m", "pkg/train.py", "--grid", "args.lr=1e-3"], ["module: 'pkg/train.py' is not a module name"]),
])
def test_a_bad_script_sweep_is_one_line_and_exit_2(tmp_path, args, words):
    config = tmp_path / "base.yaml"
    config.write_text(f"launch: {{run_root: {tmp_path / 'runs'}}}\n")
    (tmp_path / "train.py").write_text("import workbench\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([*CLI, "sweep", *([] if "--resume" in args else [str(config)]), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: "), done.stderr
    for word in words:
        assert word.replace("{tmp}", str(tmp_path)) in lines[0]
    assert not (tmp_path / "runs").exists()


def test_resuming_a_folder_that_is_not_a_sweep_names_it(tmp_path):
    done = subprocess.run([*CLI, "sweep", "--resume", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 2 and f"{tmp_path}: not a sweep folder (no sweep.json)" in done.stderr, done.stderr
    nothing = subprocess.run([*CLI, "sweep"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert nothing.returncode == 2 and "give the base config" in nothing.stderr, nothing.stderr
    assert Path(tmp_path).is_dir()


@pytest.mark.parametrize("damage, words", [
    (lambda f: f.journal.write_bytes(b"garbage\n" + f.journal.read_bytes()), "study.journal is damaged (line 1"),
    (lambda f: f.journal.write_bytes(b""), "study.journal is damaged (it is empty)"),
    (lambda f: f.payload_pickle.write_bytes(b"garbage"), "payload.pkl is damaged (UnpicklingError"),
    (lambda f: f.meta.write_bytes(b"{not json"), "sweep.json is damaged"),
])
def test_resuming_a_damaged_sweep_is_one_line_naming_the_file_and_exit_2(tmp_path, damage, words):
    """What a killed driver or a bad copy leaves beyond a torn last line (issue 30 item 6): a traceback
    and exit 1 before."""
    from tests.support.sweeps import sweep_folder

    pytest.importorskip("optuna")
    folder = sweep_folder(tmp_path, told=1)
    damage(folder)
    done = subprocess.run([*CLI, "sweep", "--resume", str(folder.root)], cwd=REPO, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"workbench: {folder.root}/") and words in lines[0], done.stderr
    assert "workbench.sweep(" in lines[0]
