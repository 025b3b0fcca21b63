"""Every failure says what happened (2 real ranks): a factory the ranks cannot unpickle, one that
raises or crashes while building the task, a script that is gone, torchrun's error file, a full
disk; and checkpoints: none readable on resume, one skipped, temp files never left."""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import subprocess
import sys
import time

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import CLI, OPTIONS, assert_nothing_left, cfg, checkpoint_steps, metric_steps, report
from tests.support.tasks_for_tests import big, crashing_while_building, failing_to_build
from workbench.errors import SubmitError
from workbench.launch import submit as submit_module

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]

NOTEBOOK_MODULE = """
from workbench.engine.builtin_tasks import synthetic_classification

def make_task(**options):
    return synthetic_classification(**options)
"""


def _fails(run, case, timeout=180):
    """Wait for the run to fail; report the time from the failure (its error record) to then."""
    status = run.wait(timeout=timeout)
    seen = time.time()
    assert status.state == "failed", status
    report(case, seen - run.exception().time)


def test_a_factory_from_a_module_only_the_notebook_can_import_is_named(tmp_path, monkeypatch):
    """The issue's case: a module on the notebook's sys.path (not on the ranks')."""
    (tmp_path / "nbmods").mkdir()
    (tmp_path / "nbmods" / "my_models.py").write_text(NOTEBOOK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "nbmods"))
    my_models = importlib.import_module("my_models")  # as a notebook would after sys.path.append

    run = workbench.submit(cfg(tmp_path), task=functools.partial(my_models.make_task, **OPTIONS))
    _fails(run, "factory module not importable on the ranks -> run failed, named")
    failure = run.exception()
    assert failure.type == "ModuleNotFoundError" and "my_models" in failure.message
    assert "PYTHONPATH" in failure.message and "while unpickling the task factory" in failure.traceback
    assert "No module named 'my_models'" in failure.traceback  # the user sees the cause, not our frames
    assert "result()" not in str(failure)
    with pytest.raises(workbench.RunFailed, match="rank [01].*ModuleNotFoundError.*my_models"):
        run.result()
    shown = subprocess.run([*CLI, "show", str(run.folder)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "ModuleNotFoundError" in shown.stderr  # show did its job: exit 0
    assert "while unpickling the task factory" in shown.stderr  # the cause and the fix, not our frames
    assert_nothing_left(run.folder)


def test_a_factory_that_raises_while_building_names_rank_type_message_and_frame(tmp_path):
    run = workbench.submit(cfg(tmp_path), task=functools.partial(failing_to_build, 1, **OPTIONS))
    _fails(run, "factory raising while building -> run failed, named")
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "ValueError") and "no such dataset" in failure.message
    assert "tasks_for_tests.py" in failure.traceback and "failing_to_build" in failure.traceback
    assert_nothing_left(run.folder)


def test_a_rank_that_crashes_in_native_code_is_named_with_its_python_stacks(tmp_path):
    """Nothing is written by the rank itself: its agent names the signal and takes the stacks that
    faulthandler printed on the rank's stderr."""
    run = workbench.submit(cfg(tmp_path), task=functools.partial(crashing_while_building, 1, **OPTIONS))
    _fails(run, "SIGSEGV while building -> run failed, named")
    failure = run.exception()
    assert (failure.rank, failure.type) == (1, "Lost") and "SIGSEGV" in failure.message
    assert "crashing_while_building" in failure.traceback and "Segmentation fault" in failure.traceback
    assert "tasks_for_tests.py:" in failure.message and failure.message.endswith("in crashing_while_building")
    assert_nothing_left(run.folder)


def test_a_script_gone_before_the_ranks_start_is_named(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "train_ddp.py", script)
    start = submit_module._start

    def remove_then_start(*args, **kwargs):  # after submit's own checks, before any process starts
        script.unlink()
        return start(*args, **kwargs)

    monkeypatch.setattr(submit_module, "_start", remove_then_start)
    run = workbench.submit_script(script, [], workbench.JobConfig.from_dict(
        {"launch": {"run_root": str(tmp_path / "runs")}}), nproc=2)
    assert not script.exists()
    _fails(run, "script missing on the ranks -> run failed, named")
    failure = run.exception()
    assert failure.type == "FileNotFoundError" and "train.py" in failure.message + failure.traceback
    missing = subprocess.run([*CLI, "launch", str(script), "--nproc", "2"], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "train.py" in missing.stderr and "Traceback" not in missing.stderr
    assert_nothing_left(run.folder)


def test_torchrun_prints_the_failing_ranks_traceback(tmp_path):
    path = tmp_path / "job.yaml"
    cfg(tmp_path, task="tests.support.tasks_for_tests:failing_at", options={"step_calls": 3, "rank": 1}).to_yaml(path)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "workbench.train", str(path), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "error_file: <N/A>" not in proc.stderr, proc.stderr[-3000:]
    assert "injected failure on rank 1" in proc.stderr and "Traceback" in proc.stderr
    assert workbench.Run.load(tmp_path / "run").exception().rank == 1


def test_a_full_disk_is_named_with_the_path_and_the_last_checkpoint_survives(tmp_path, small_disk):
    """Checkpoints of a few MB each into 40 MB: one of them does not fit."""
    run = workbench.submit(cfg(small_disk, max_steps=1000, checkpoint_every_steps=5, keep_checkpoints=5),
                           task=functools.partial(big, **OPTIONS))
    _fails(run, "disk full while checkpointing -> run failed, named")
    failure = run.exception()
    assert failure.rank == 0 and "disk full" in failure.message, failure
    kept = checkpoint_steps(run.folder)  # every finished one loads
    assert kept == list(range(5, kept[-1] + 1, 5)) and len(kept) >= 2
    assert f"checkpoints/step-{kept[-1] + 5:08d}.pt" in failure.message, "the file that did not fit"
    assert not [p for p in (run.folder / "checkpoints").iterdir() if "tmp" in p.name], "temp checkpoint left"
    steps = metric_steps(run)
    assert steps[0][:kept[-1]] == steps[1][:kept[-1]] == list(range(1, kept[-1] + 1))
    assert_nothing_left(run.folder)


def test_checkpoints_on_resume_skipped_named_or_refused(tmp_path):
    """A corrupt latest checkpoint is skipped (and said so); when none is readable, the submission
    fails naming them, and from_scratch starts over with them set aside."""
    job = cfg(tmp_path, max_steps=20)
    first = workbench.submit(job)
    assert first.wait(timeout=180).state == "finished", first.exception()
    folder = first.folder
    latest = folder / "checkpoints" / "step-00000020.pt"
    latest.write_bytes(latest.read_bytes()[:100])  # torn by a crash
    resumed = workbench.submit(job.replace(train__max_steps=30), run_dir=folder)
    assert resumed.wait(timeout=180).state == "finished", resumed.exception()
    summary = resumed.event_summary()
    assert summary.resumed_from.endswith("step-00000010.pt")
    assert len(summary.skipped_checkpoints) == 1 and "step-00000020.pt" in summary.skipped_checkpoints[0]
    shown = subprocess.run([*CLI, "show", str(folder)], capture_output=True, text=True, timeout=60)
    assert "resumed from" in shown.stdout and "skipped unreadable checkpoint" in shown.stdout

    for path in (folder / "checkpoints").glob("step-*.pt"):
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(SubmitError, match=r"none can be read.*step-00000030\.pt.*from_scratch"):
        workbench.submit(job, run_dir=folder)
    yaml = tmp_path / "job.yaml"
    job.to_yaml(yaml)
    refused = subprocess.run([*CLI, "run", str(yaml), "--run-dir", str(folder)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "--from-scratch" in refused.stderr and "step-00000030.pt" in refused.stderr
    submitted = time.time()
    fresh = workbench.submit(job, run_dir=folder, from_scratch=True)
    assert fresh.wait(timeout=180).state == "finished", fresh.exception()
    events = fresh.events()
    assert "resume" not in set(events[events["time"] > submitted]["event"]), "from scratch: no resume"
    assert checkpoint_steps(folder)[-1] == 20
    assert list((folder / "checkpoints").glob("set-aside-*/step-00000030.pt")), "the old ones are kept aside"
    assert_nothing_left(folder)


def test_provenance_is_in_run_json(tmp_path):
    os.environ["NCCL_DEBUG"] = "WARN"
    try:
        run = workbench.submit(cfg(tmp_path, max_steps=4))
    finally:
        del os.environ["NCCL_DEBUG"]
    assert run.wait(timeout=180).state == "finished", run.exception()
    meta = run.meta
    assert meta["runtime"]["torch"].startswith("2.") and "cuda" in meta["runtime"] and "nccl" in meta["runtime"]
    assert meta["runtime"]["hosts"] and len(meta["runtime"]["rank_hosts"]) == 2
    assert meta["python"] and meta["submitted_by"]["command"] and meta["dist_env"]["NCCL_DEBUG"] == "WARN"
    assert len(meta["git"]["commit"]) == 40  # the tests run inside the repository
