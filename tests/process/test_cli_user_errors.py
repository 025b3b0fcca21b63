"""User errors met from a terminal, in fresh processes: one line and exit 2 for a bad config file, an
unwritable run root, a full disk at submit (a small tmpfs), torchrun without a shared run folder."""
from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest

from tests.support.fixtures import tmpfs
from workbench.cli import main
from workbench.config import JobConfig
from workbench.errors import ConfigError

pytestmark = pytest.mark.timeout(300)
"""Each fuzzed call must return within this (a hang detector: typical calls take milliseconds)."""
"""Examples per fuzz test (raise it for a long hunt: WORKBENCH_FUZZ_EXAMPLES=5000)."""


def _bomb(levels: int = 9) -> str:
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"    {names[0]}: &{names[0]} [x, x, x, x, x, x, x, x, x]"]
    lines += [f"    {n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip(names, names[1:])]
    return "task:\n  options:\n" + "\n".join(lines) + "\n"



def test_an_unwritable_run_root_is_rejected_by_check_and_run(tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "64k", "ro") as readonly:
        path = tmp_path / "job.yaml"
        path.write_text(f"launch:\n  run_root: {readonly}/runs\n")
        line = (f"workbench: launch.run_root: cannot write to {readonly} (where {readonly}/runs would be made); "
                "choose a folder you can write, e.g. runs or a folder under your home\n")
        assert main(["check", str(path)]) == 2
        assert capsys.readouterr().err == line
        assert main(["run", str(path)]) == 2
        assert capsys.readouterr().err == line
        with pytest.raises(ConfigError, match="launch.run_root: cannot write"):
            import workbench

            workbench.submit(JobConfig.from_yaml(path))



def test_a_full_disk_at_submit_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    with tmpfs(tmp_path / "full", "64k") as disk:
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
        path = tmp_path / "job.yaml"
        path.write_text(f"launch:\n  run_root: {disk}/runs\n  name: full\ntrain:\n  max_steps: 1\n")
        assert main(["run", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"workbench: launch.run_root: cannot make the run folder {disk}/runs/full-")
        assert err.endswith("(No space left on device); free some space, or set launch.run_root to a folder on "
                            "another disk\n") and err.count("\n") == 1
        runs = disk / "runs"
        assert not runs.exists() or list(runs.iterdir()) == []  # no half-made run folder; nothing was started



def test_the_cli_prints_one_line_for_a_bad_config_in_a_fresh_process(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(_bomb().encode())
    done = subprocess.run([sys.executable, "-m", "workbench.cli", "check", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"workbench: {path}: anchors and aliases (&name, *name) expand to more than 100000 values; "
                           "write the values out, or use fewer aliases\n")


def test_train_module_without_a_shared_run_folder_says_how(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "job.yaml"
    JobConfig().to_yaml(path)
    proc = subprocess.run([sys.executable, "-m", "workbench.train", str(path)], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in __import__("os").environ.items()
                                           if k != "TORCHELASTIC_RUN_ID"})
    assert proc.returncode == 2 and "--run-dir" in proc.stderr and "--standalone" in proc.stderr

