"""Script mode: an existing torchrun-style script launched with the workbench's environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from workbench.config import JobConfig

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(180)]
SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"


def _cfg(tmp_path: Path) -> JobConfig:
    return JobConfig.from_dict({"launch": {"run_root": str(tmp_path)}})


def test_script_gets_the_torchrun_contract_and_streams_per_rank_metrics(tmp_path):
    run = workbench.submit_script(SCRIPT, ["--steps", "12"], _cfg(tmp_path), nproc=2)
    assert run.wait(timeout=120).state == "finished", run.exception()
    frame = run.metrics()
    assert frame.groupby("rank")["step"].max().tolist() == [12, 12]
    assert frame["loss"].notna().all()


def test_script_failure_names_the_rank_and_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_ON_RANK", "1")
    run = workbench.submit_script(SCRIPT, ["--steps", "3"], _cfg(tmp_path), nproc=2)
    assert run.wait(timeout=120).state == "failed"
    failure = run.exception()
    assert failure.rank == 1 and "script failed on rank 1" in failure.traceback


def test_cli_launch_passes_script_arguments(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", str(SCRIPT), "--nproc", "2",
                           "--set", f"launch.run_root={tmp_path}", "--", "--steps", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "finished (step 5; ranks 0:finished@5, 1:finished@5)" in proc.stdout  # --steps 5 reached the script


def test_log_outside_a_workbench_run_does_nothing(monkeypatch):
    monkeypatch.delenv("WORKBENCH_RUN_DIR", raising=False)
    workbench.log(step=1, loss=0.5)  # no error, nothing written


def test_export_torchrun_and_sbatch(tmp_path, capsys):
    from workbench.cli import main

    path = tmp_path / "job.yaml"
    JobConfig.from_dict({"dist": {"nodes": 2, "procs_per_node": 4},
                         "launch": {"executor": "slurm", "slurm": {"partition": "gpu", "gpus_per_node": 4,
                                                                    "setup": ["module load cuda"]}}}).to_yaml(path)
    assert main(["export", str(path), "--torchrun"]) == 0
    line = capsys.readouterr().out
    assert "--nnodes=2" in line and "--nproc_per_node=4" in line and "-m workbench.train" in line
    assert main(["export", str(path), "--sbatch"]) == 0
    script = capsys.readouterr().out
    for want in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", "module load cuda",
                 "srun torchrun", "--rdzv_endpoint=$MASTER_ADDR"):
        assert want in script, want
