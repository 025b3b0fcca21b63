"""Script mode: an existing torchrun-style script launched with the workbench's environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from tests.support import SCRIPTS
from workbench.config import JobConfig

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(180)]
SCRIPT = SCRIPTS / "train_ddp.py"


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


def test_log_outside_a_workbench_run_does_nothing(monkeypatch, tmp_path, capsys, recwarn):
    """A script run without workbench (plain python or torchrun) may call workbench.log: no error, no
    warning, no output, nothing written (no metrics file opened, not in the working folder either)."""
    from workbench.engine import script

    monkeypatch.delenv(script.RUN_DIR_ENV, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.chdir(tmp_path)
    writer = script._writer
    assert workbench.log(step=1, loss=0.5) is None
    assert script._writer is writer, "a metrics writer was opened outside a run"
    assert list(tmp_path.rglob("*")) == []
    assert capsys.readouterr() == ("", "") and len(recwarn) == 0


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


# --- torchrun parity -----------------------------------------------------------------------------
PROJ = SCRIPTS


def _seen(out: Path) -> list[dict]:
    import json

    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_a_script_sees_what_torchrun_gives_it(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # launched from another folder: the script's own folder is on sys.path
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2", "--quiet",
                           "--env", "PROBE=yes", "--set", f"launch.run_root={tmp_path / 'runs'}",
                           str(PROJ / "proj" / "probe.py"), str(out), "--lr", "3"],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for rank, seen in enumerate(_seen(out)):
        env = seen["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["ROLE_RANK"], env["ROLE_NAME"]) == (
            str(rank), str(rank), "2", str(rank), "default")
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RUN_ID"] and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False" and seen["elastic"]
        assert env["OMP_NUM_THREADS"] == "1" and seen["threads"] == 1  # torchrun's rule for 2 ranks on a node
        assert seen["argv"] == [str(out), "--lr", "3"]  # arguments after the script, without --
        assert seen["cwd"] == str(elsewhere) and env["PROBE"] == "yes" and seen["greeting"] == "hello"


def test_module_mode_cwd_and_threads_per_rank(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cfg = JobConfig.from_dict({"dist": {"threads_per_rank": 2}, "launch": {"run_root": str(tmp_path / "runs")}})
    run = workbench.submit_script(None, [str(out)], cfg, nproc=2, module="proj.probe", cwd=PROJ)
    assert run.wait(timeout=120).state == "finished", run.exception()
    for seen in _seen(out):
        assert seen["name"] == "__main__" and seen["cwd"] == str(PROJ) and seen["greeting"] == "hello"
        assert seen["threads"] == 2 and seen["env"]["OMP_NUM_THREADS"] == "2"


def test_the_tutorials_peek_is_no_set_epoch_false_alarm(tmp_path):
    run = workbench.submit_script(PROJ / "tutorial_peek.py", [], _cfg(tmp_path), nproc=2)
    assert run.wait(timeout=120).state == "finished", run.exception()
    assert run.health()["warnings"] == []


def test_stall_detection_honours_stall_after_s_and_counts_output_as_life(tmp_path):
    cfg = JobConfig.from_dict({"dist": {"stall_after_s": 3}, "launch": {"run_root": str(tmp_path)}})
    chatty = workbench.submit_script(PROJ / "chatty.py", [], cfg, nproc=2)
    quiet = workbench.submit_script(PROJ / "chatty.py", ["--quiet"], cfg, nproc=2)
    for run in (chatty, quiet):
        assert run.wait(timeout=120).state == "finished", run.exception()
    stalled = {name: set(run.events().query("event == 'stalled'")["rank"]) if "event" in run.events() else set()
               for name, run in (("chatty", chatty), ("quiet", quiet))}
    assert stalled == {"chatty": set(), "quiet": {0, 1}}  # printing is life; 8 s of silence is a stall at 3 s
