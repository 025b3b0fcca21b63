"""Sweeps on the real SLURM test cluster: the trials are the elements of ONE job array (sbatch
--array=0-N%P, `parallel` as P), each element bound to its trial when it starts, the study in this
process.  A 4-point grid two at a time shares one array id and never runs more than 2 trials at
once; a pruned trial cancels its element alone; Sweep.cancel() leaves no process and no queued
element; a sweep whose driver was killed goes on with Sweep.load, its queued elements followed (no
second array) and no finished trial repeated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from tests.support import REPO
from tests.support.lifecycle import ENDLESS, assert_nothing_left, run_processes, wait_until
from tests.support.tasks_for_tests import slow
from workbench.config import JobConfig
from workbench.errors import SubmitError
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir, SweepDir

optuna = pytest.importorskip("optuna")
pytestmark = [pytest.mark.slurm]


def _cfg(tmp_path: Path, cluster, **train) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": {"n_train": 1024, "n_val": 128}},
        "train": {"micro_batch_size": 16, "max_steps": 8, "eval_every_steps": 4, "checkpoint_every_steps": None,
                  **train},
        "dist": {"nodes": 2, "procs_per_node": 1, "timeout_s": 60, "threads_per_rank": 1},
        "launch": {"executor": "slurm", "run_root": str(tmp_path / "runs"), "time_limit": "10",
                   "slurm": {"partition": cluster.partition, "cpus_per_task": 1}},
    })


def _arrays(sweep_folder: Path) -> list[dict]:
    return list((SweepDir(sweep_folder).read_meta() or {}).get("arrays") or [])


def _sacct(array_id: str) -> dict[str, str]:
    """Element JOB_I -> its state, as SLURM's accounting has it."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "JobID,State"], capture_output=True,
                         text=True, timeout=30)
    pairs = (line.split("|") for line in out.stdout.splitlines() if line.strip())
    return {p[0]: p[1].split()[0] for p in pairs if len(p) == 2}


def _queued(array_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-r", "-j", array_id, "-o", "%i %T"], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.strip()


def _nothing_left(sweep_folder: Path, array_id: str) -> None:
    """No element queued or running, no process of any trial or element (an element's command line
    names the sweep folder)."""
    wait_until(lambda: not _queued(array_id), 60, f"array {array_id} out of the queue")
    wait_until(lambda: not run_processes(sweep_folder), 60, "every process of the sweep gone")  # scancel's KillWait
    assert_nothing_left(sweep_folder)
    for trial in sorted(SweepDir(sweep_folder).root.glob("trial-*")):
        assert_nothing_left(trial)


def _most_at_once(runs: list[Run]) -> int:
    """The most trials whose runs were going at one time, each from its run folder's making (when
    the driver bound it to its element, which had started) to its last event."""
    spans = [(float(run.meta["created"]), float(run.events()["time"].max())) for run in runs]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    most = going = 0
    for _, step in edges:
        going += step
        most = max(most, going)
    return most


@pytest.mark.timeout(600)
def test_a_grid_on_slurm_is_one_job_array_two_at_a_time(slurm_cluster, tmp_path):
    lrs = [1e-3, 2e-3, 5e-3, 1e-2]
    sweep = workbench.sweep(_cfg(tmp_path, slurm_cluster), {"train.lr": lrs}, parallel=2, pruner="none")
    wait_until(lambda: _arrays(sweep.folder), 120, "the array submitted")
    shown = subprocess.run(["squeue", "-h", "-j", _arrays(sweep.folder)[0]["job_id"], "-o", "%i"],
                           capture_output=True, text=True, timeout=30).stdout.split()
    assert shown and all(job.startswith(f"{_arrays(sweep.folder)[0]['job_id']}_") for job in shown), shown
    print(f"\n[sweep] squeue right after the submission: {shown}", flush=True)  # e.g. ['123_[0-3%2]']
    sweep.wait(timeout=540)
    frame = sweep.frame()
    assert len(frame) == 4 and set(frame["state"]) == {"finished"}, frame
    assert sorted(frame["train.lr"]) == lrs
    (array,) = _arrays(sweep.folder)  # one array for the whole grid
    array_id = array["job_id"]
    assert array["size"] == 4
    script = (SweepDir(sweep.folder).arrays / f"{array_id}_submission.sh").read_text()
    assert "#SBATCH --array=0-3%2" in script, script  # squeue shows it as JOBID_[0-3%2]
    job_ids = set()
    for run in sweep.runs:  # each trial an ordinary run, on the element that ran it
        meta = run.meta
        assert meta["executor"] == "slurm" and str(meta["job_id"]).startswith(f"{array_id}_")
        assert {r.host for r in run.status().ranks} == {"n1", "n2"}
        assert f"job_id={meta['job_id']}," in run.logs(0, "out")  # submitit's log of the element, from the run
        job_ids.add(str(meta["job_id"]))
    assert job_ids == {f"{array_id}_{i}" for i in range(4)}
    wait_until(lambda: _sacct(array_id) == {job: "COMPLETED" for job in job_ids}, 60, "every element COMPLETED")
    assert _most_at_once(sweep.runs) == 2  # parallel=2: the array's %2, never more
    assert any("job array" in line for line in sweep.events)
    _nothing_left(sweep.folder, array_id)


@pytest.mark.timeout(600)
def test_trials_of_two_resource_shapes_are_two_arrays_one_after_the_other(slurm_cluster, tmp_path):
    """SLURM gives every element of an array the same resources: a grid over dist.nodes is one
    array per shape, the second starting once the first ended (afterany)."""
    sweep = workbench.sweep(_cfg(tmp_path, slurm_cluster), {"dist.nodes": [1, 2]}, parallel=2, pruner="none")
    sweep.wait(timeout=540)
    frame = sweep.frame()
    assert set(frame["state"]) == {"finished"} and len(frame) == 2, frame
    first, second = _arrays(sweep.folder)
    assert first["size"] == second["size"] == 1 and second["after"] == [first["job_id"]]
    script = (SweepDir(sweep.folder).arrays / f"{second['job_id']}_submission.sh").read_text()
    assert f"#SBATCH --dependency=afterany:{first['job_id']}" in script and "#SBATCH --nodes=2" in script
    for run in sweep.runs:  # each trial on an element of its own shape
        shape = first if run.world_size == 1 else second
        assert str(run.meta["job_id"]) == f"{shape['job_id']}_0"
    _nothing_left(sweep.folder, second["job_id"])


@pytest.mark.timeout(600)
def test_a_pruned_trial_cancels_its_element_alone(slurm_cluster, tmp_path):
    """lr 1e4 blows the loss up at its first steps; each step takes 0.05 s (the slowed task), so its
    400 steps last long after that: only the pruner ends it, with scancel JOB_I.  The other element
    runs its trial to the end."""
    c = _cfg(tmp_path, slurm_cluster, epochs=100, max_steps=400, eval_every_steps=None).replace(
        task__name=f"{slow.__module__}:slow", task__options={"n_train": 1024, "n_val": 128, "delay_s": 0.05})
    sweep = workbench.sweep(c, {"train.lr": [1e4, 1e-3]}, metric="loss", parallel=2,
                            pruner=optuna.pruners.ThresholdPruner(upper=5.0)).wait(timeout=540)
    frame = sweep.frame().set_index("train.lr")
    assert frame.loc[1e4, "state"] == "pruned" and frame.loc[1e-3, "state"] == "finished", frame
    pruned, finished = Run.load(frame.loc[1e4, "run"]), Run.load(frame.loc[1e-3, "run"])
    assert pruned.status().state == "pruned" and "pruned" in pruned.meta["cancelled_by"]
    assert finished.status().step == 400
    (array,) = _arrays(sweep.folder)
    expected = {str(pruned.meta["job_id"]): "CANCELLED", str(finished.meta["job_id"]): "COMPLETED"}
    try:
        wait_until(lambda: _sacct(array["job_id"]) == expected, 60, f"sacct saying {expected}")
    except AssertionError:  # say what sacct said instead
        raise AssertionError(f"sacct says {_sacct(array['job_id'])} after 60 s, not {expected}") from None
    _nothing_left(sweep.folder, array["job_id"])


@pytest.mark.timeout(600)
def test_sweep_cancel_leaves_no_process_and_no_queued_element(slurm_cluster, tmp_path):
    c = _cfg(tmp_path, slurm_cluster, **ENDLESS)
    sweep = workbench.sweep(c, {"train.lr": [1e-3, 2e-3, 3e-3]}, parallel=1, pruner="none")
    wait_until(lambda: _arrays(sweep.folder), 120, "the array submitted")
    (array,) = _arrays(sweep.folder)
    wait_until(lambda: sweep.runs and sweep.runs[0].status().step >= 1, 300, "trial 0 training")
    assert len(sweep.runs) == 1 and _queued(array["job_id"])  # elements 1 and 2 wait in the queue
    sweep.cancel()
    _nothing_left(sweep.folder, array["job_id"])
    run = sweep.runs[0]
    assert run.status().state == "cancelled"
    wait_until(lambda: set(_sacct(array["job_id"]).values()) == {"CANCELLED"}, 60, "every element CANCELLED")
    seen = workbench.sweeps.Sweep.load(sweep.folder, resume=False)
    assert set(seen.frame()["state"]) == {"cancelled"} and seen.done


@pytest.mark.timeout(300)
def test_an_element_that_dies_before_its_trial_stops_the_sweep_in_one_line(slurm_cluster, tmp_path):
    """The array's sbatch setup fails (a broken module load, say): the element never reaches
    Python, so no trial can start; the driver says which element and where its log is, instead of
    submitting arrays for ever."""
    c = _cfg(tmp_path, slurm_cluster)
    c = c.replace(launch__slurm={**c.to_dict()["launch"]["slurm"], "setup": ["exit 3"]})
    sweep = workbench.sweep(c, {"train.lr": [1e-3]}, pruner="none")
    with pytest.raises(SubmitError, match=r"SLURM array element \d+_0 ended before it started a trial; see .*err"):
        sweep.wait(timeout=240)
    (array,) = _arrays(sweep.folder)
    assert not sweep.runs and not _queued(array["job_id"])


DRIVER = """
import sys, workbench
from workbench.config import JobConfig
cfg = JobConfig.from_yaml(sys.argv[1])
sweep = workbench.sweep(cfg, {"train.lr": [1e-3, 2e-3, 3e-3]}, pruner="none", name="killed", background=False)
print(sweep.folder, flush=True)
sweep.wait()
"""


@pytest.mark.timeout(600)
def test_a_slurm_sweep_whose_driver_was_killed_goes_on_with_sweep_load(slurm_cluster, tmp_path):
    config = tmp_path / "base.yaml"
    _cfg(tmp_path, slurm_cluster, max_steps=30, eval_every_steps=10).to_yaml(config)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(config)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        folder = SweepDir(Path(driver.stdout.readline().strip()))
        wait_until(RunDir(folder.trial(1)).meta.exists, 300, "the driver bound trial 1")  # trial 0 ended: %1
    finally:
        driver.kill()
        driver.wait()
    first = Run.load(folder.trial(0))
    assert first.status().state == "finished"
    first_summary = first.dir.summary.stat().st_mtime_ns
    sweep = workbench.sweeps.Sweep.load(folder.root).wait(timeout=480)
    frame = sweep.frame()
    done = frame[frame["state"] == "finished"]
    assert sorted(done["train.lr"]) == [1e-3, 2e-3, 3e-3], frame  # every point once, trial 0 not again
    assert first.dir.summary.stat().st_mtime_ns == first_summary
    (array,) = _arrays(folder.root)  # the queued element was answered by the new driver: no second array
    assert {str(run.meta["job_id"]) for run in sweep.runs} == {f"{array['job_id']}_{i}" for i in range(3)}
    assert any("followed again" in line for line in sweep.events)
    _nothing_left(folder.root, array["job_id"])
