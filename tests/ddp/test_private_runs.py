"""Private by default: under umask 000, a real 2-rank run leaves every folder it made 0700 and every
file 0600 -- run root, run folder, metrics, events, status, checkpoints, config.yaml, run.json,
summary, plots, and submitit's pickles and logs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.support.lifecycle import assert_nothing_left
from workbench.config import JobConfig

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]


def test_a_run_under_umask_000_creates_only_private_folders_and_files(tmp_path):
    base = tmp_path / "shared"
    base.mkdir()
    os.chmod(base, 0o777)  # a folder the user made themselves keeps its mode
    root = base / "deep" / "runs"  # the workbench makes these two
    cfg = JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 256, "n_val": 64}},
        "train": {"micro_batch_size": 16, "max_steps": 6, "checkpoint_every_steps": 3},
        "dist": {"procs_per_node": 2, "timeout_s": 60, "threads_per_rank": 1},
        "launch": {"run_root": str(root), "name": "private", "time_limit": "10"},
    })
    cfg.to_yaml(tmp_path / "job.yaml")
    done = subprocess.run(["bash", "-c", f'umask 000 && exec "{sys.executable}" -m workbench.cli run '
                                         f'"{tmp_path / "job.yaml"}" --quiet'],
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_nothing_left(root)
    (run,) = root.iterdir()
    made = {p: stat.S_IMODE(p.lstat().st_mode) for p in [base / "deep", *(base / "deep").rglob("*")]}
    kinds = {p.relative_to(run).parts[0] for p in made if run in p.parents}
    assert {"metrics", "events", "status", "checkpoints", "plots", "logs", "config.yaml", "run.json",
            "summary.json"} <= kinds
    assert any(p.suffix == ".pkl" for p in made) and any(p.name.endswith("_log.out") for p in made)
    assert any(p.suffix == ".pt" for p in made) and (run / "plots" / "loss.png") in made
    wrong = {str(p): oct(m) for p, m in made.items() if m != (0o700 if p.is_dir() else 0o600)}
    assert wrong == {}
    assert stat.S_IMODE(base.stat().st_mode) == 0o777
