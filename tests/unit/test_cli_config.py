"""`workbench --version` and `workbench config`: the resolved config, its docs, and where the code
reads a field (in process: no rank is started)."""

from __future__ import annotations

import pytest
import yaml

from workbench import __version__
from workbench.cli import main

pytestmark = pytest.mark.timeout(60)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"workbench {__version__}"


def test_config_prints_the_resolved_config_with_overrides(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n  micro_batch_size: 8\n")
    assert main(["config", str(path), "--set", "train.lr=3e-4", "--set", "dist.procs_per_node=1"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["train"]["lr"] == 3e-4 and data["train"]["micro_batch_size"] == 8
    assert data["dist"]["procs_per_node"] == 1 and data["scaling"]["rule"] == "linear"  # defaults filled in


def test_config_docs_lists_every_field_with_its_value(capsys):
    assert main(["config", "--docs"]) == 0
    out = capsys.readouterr().out
    assert "train.grad_accum_steps = 1\n    Micro-batches accumulated before each optimizer step." in out
    assert "\ntrain = " not in out  # sections are opened, not printed whole


def test_config_where_names_the_code_that_reads_a_field(capsys):
    assert main(["config", "--where", "train.grad_accum_steps"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("train.grad_accum_steps: Micro-batches accumulated")
    assert "workbench/engine/trainer.py:" in out and "workbench/config/scaling.py:" in out


def test_config_where_rejects_what_is_not_a_field(capsys):
    assert main(["config", "--where", "train.nope"]) == 2
    assert "--where: 'train.nope' is not a config field" in capsys.readouterr().err
    assert main(["config", "--where", "train"]) == 2  # a section, not a field


# --- workbench launch: which arguments are the script's ------------------------------------------
@pytest.mark.parametrize("argv, own, script", [
    (["launch", "--nproc", "2", "t.py", "--lr", "3"], ["launch", "--nproc", "2", "t.py"], ["--lr", "3"]),
    (["launch", "t.py", "--nproc", "2", "--", "--lr", "3"], ["launch", "t.py", "--nproc", "2"], ["--lr", "3"]),
    (["launch", "-m", "pkg.mod", "x"], ["launch", "-m", "pkg.mod"], ["x"]),
    (["launch", "--set", "a.b=1", "t.py", "--", "--nproc", "4"], ["launch", "--set", "a.b=1", "t.py"],
     ["--nproc", "4"]),
    (["run", "job.yaml", "--", "ignored"], ["run", "job.yaml"], ["ignored"]),
])
def test_script_arguments_are_split_as_torchrun_does(argv, own, script):
    from workbench.cli import split_script_args

    assert split_script_args(argv) == (own, script)


def test_a_workbench_option_after_the_script_says_where_to_put_it():
    from workbench.cli import split_script_args
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="--nproc comes after the script.*before the script.*end them with --"):
        split_script_args(["launch", "t.py", "--nproc", "2", "--lr", "3"])
