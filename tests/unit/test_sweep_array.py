"""A SLURM sweep's job arrays, in their pure parts (no process, no cluster): which spaces one array
can hold, the sbatch script of an array (--array=0-N%P, the chain to the array before it), which
grid point a started element of each resource shape is given (one queued again first, never another
shape's), and the marker-and-answer exchange between an element and the driver.  The real thing
runs in tests/slurm/test_sweep_slurm.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import workbench
from workbench.config import JobConfig
from workbench.engine.sweep_element import say_waiting, wait_bound
from workbench.errors import ConfigError
from workbench.launch.executors import slurm_array_executor, slurm_shape
from workbench.runfolder.layout import RunDir, SweepDir
from workbench.sweeps.array import shape_key, slurm_space_problems

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.timeout(60)


def _cfg(tmp_path: Path, executor: str = "slurm") -> JobConfig:
    return JobConfig.from_dict({"dist": {"nodes": 1, "procs_per_node": 1},
                                "launch": {"executor": executor, "run_root": str(tmp_path / "runs")}})


def test_trials_that_differ_in_lr_share_a_shape_and_in_ranks_do_not(tmp_path):
    cfg = _cfg(tmp_path)
    assert slurm_shape(cfg.replace(train__lr=0.5)) == slurm_shape(cfg)
    assert shape_key(cfg.replace(dist__procs_per_node=2)) != shape_key(cfg)
    assert shape_key(cfg.replace(launch__time_limit="30")) != shape_key(cfg)


def test_a_sampled_space_must_keep_one_shape_on_slurm(tmp_path):
    sweeps = workbench.sweeps
    lr = {"train.lr": sweeps.loguniform(1e-4, 1e-2)}
    assert slurm_space_problems(_cfg(tmp_path), lr) == []
    assert slurm_space_problems(_cfg(tmp_path), {**lr, "dist.procs_per_node": [1, 2]}) != []
    (line,) = slurm_space_problems(_cfg(tmp_path), {**lr, "dist.procs_per_node": sweeps.int_range(1, 2)})
    assert line.startswith("space['dist.procs_per_node']: on SLURM a sampled sweep") and "as a list" in line
    assert slurm_space_problems(_cfg(tmp_path), {"train.lr": [1e-3], "dist.procs_per_node": [1, 2]}) == []  # a grid
    assert slurm_space_problems(_cfg(tmp_path, "local"), {**lr, "dist.procs_per_node": [1, 2]}) == []


def test_workbench_sweep_refuses_such_a_space_before_anything_is_made(tmp_path):
    space = {"train.lr": workbench.sweeps.loguniform(1e-4, 1e-2), "dist.nodes": workbench.sweeps.int_range(1, 2)}
    with pytest.raises(ConfigError) as err:
        workbench.sweep(_cfg(tmp_path).replace(launch__executor="local"), space, trials=4, executor="slurm")
    assert str(err.value).startswith("space['dist.nodes']: on SLURM a sampled sweep"), err.value
    assert not (tmp_path / "runs").exists()


def test_an_array_script_asks_n_elements_p_at_once_after_the_array_before(tmp_path, monkeypatch):
    # submitit's SlurmExecutor looks for `srun` on PATH before it writes a script; this test only reads the script
    # (tests/slurm submits real arrays), so an `srun` that is never run stands in where SLURM is not installed
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}{os.pathsep}{bin_dir}")
    executor = slurm_array_executor(_cfg(tmp_path), tmp_path / "sweep" / "arrays", 2, ["41", "42"], "grid")
    executor.parameters["map_count"] = 4  # as the array submission sets it
    script = executor._make_submission_file_text("python -m submitit.core._submit X", "uid")
    assert "#SBATCH --array=0-3%2" in script
    assert "#SBATCH --dependency=afterany:41:42" in script
    assert "#SBATCH --job-name=wb-grid" in script and "%A_%a_%t_log.out" in script


def _sweep(tmp_path: Path, space: dict) -> workbench.sweeps.Sweep:
    from workbench.sweeps.study import make_pruner, make_sampler, storage

    folder = SweepDir(tmp_path / "sweep-x").create()
    sampler = make_sampler(None, space)
    study = optuna.create_study(storage=storage(folder), study_name="sweep", sampler=sampler,
                                pruner=make_pruner("none", sampler))
    return workbench.sweeps.Sweep(folder, study, space, _cfg(tmp_path), trials=4, parallel=2, metric="val_loss")


def _claim(sweep, key: str):
    """What the driver does when an element of shape `key` starts: claim a trial, suggest its values."""
    from workbench.sweeps.driver import _suggest

    trial = sweep.arrays._claim(key)
    if trial is not None:
        for field, values in sweep.space.items():
            _suggest(trial, field, values)
    return trial


def test_each_shape_of_a_grid_gets_its_own_points_and_a_trial_queued_again_first(tmp_path):
    sweep = _sweep(tmp_path, {"dist.procs_per_node": [1, 2], "train.lr": [1e-3, 1e-2]})
    arrays = sweep.arrays
    assert arrays is not None
    one, two = (shape_key(_cfg(tmp_path).replace(dist__procs_per_node=n)) for n in (1, 2))
    assert {k: n for k, (_, n) in arrays._todo().items()} == {one: 2, two: 2}
    first = _claim(sweep, two)
    assert first.params["dist.procs_per_node"] == 2 and first.params["train.lr"] in (1e-3, 1e-2)
    assert {k: n for k, (_, n) in arrays._todo().items()} == {one: 2, two: 1}
    second = _claim(sweep, two)
    assert second.params["dist.procs_per_node"] == 2 and second.params["train.lr"] != first.params["train.lr"]
    assert _claim(sweep, two) is None  # that shape's points are all given out
    # trial 0's run died with the old driver: queued again (as Sweep.load does), it goes to the next
    # element of its shape, not to one of the other shape
    first.set_user_attr("outcome", "requeued")
    sweep.study.tell(first, state=optuna.trial.TrialState.FAIL)
    sweep.study.enqueue_trial(dict(first.params), skip_if_exists=False)
    assert {k: n for k, (_, n) in arrays._todo().items()} == {one: 2, two: 1}
    other = _claim(sweep, one)
    assert other.params["dist.procs_per_node"] == 1
    again = _claim(sweep, two)
    assert again.params == first.params and again.number != first.number


def test_a_sampled_space_asks_optuna_when_an_element_starts(tmp_path):
    sweep = _sweep(tmp_path, {"train.lr": workbench.sweeps.loguniform(1e-4, 1e-2)})
    arrays = sweep.arrays
    (key,) = arrays._todo()
    assert arrays._todo()[key][1] == 4
    trial = _claim(sweep, key)
    assert "train.lr" in trial.params and arrays._todo()[key][1] == 3
    assert sweep.study.get_trials()[0].state == optuna.trial.TrialState.RUNNING


def test_an_element_waits_for_the_drivers_answer_and_reads_it(tmp_path):
    sweep = _sweep(tmp_path, {"train.lr": [1e-3]})
    say_waiting(sweep.dir, "77_3")
    assert sweep.dir.waiting_elements() == ["77_3"]
    run = RunDir(sweep.dir.trial(0))
    sweep.arrays.answer("77_3", run, trial=0)
    assert wait_bound(sweep.dir, "77_3") == {"run_dir": str(run.root), "why": "", "trial": 0,
                                             "time": pytest.approx(wait_bound(sweep.dir, "77_3")["time"])}


def test_an_element_without_an_answer_ends_when_the_sweep_is_cancelled(tmp_path):
    sweep = _sweep(tmp_path, {"train.lr": [1e-3]})
    say_waiting(sweep.dir, "77_0")
    sweep.dir.update_meta(cancelled=1.0)
    assert wait_bound(sweep.dir, "77_0") == {"run_dir": None, "why": "the sweep cancelled"}


def _resumed_sweep(tmp_path: Path, executor: str, prepare) -> tuple[object, object, RunDir]:
    """A sweep whose old driver was killed while trial 0 was RUNNING, its run folder left as
    `prepare` leaves it; reattached as Sweep.load does (no process: the trial's status is not asked)."""
    from workbench.sweeps.driver import Sweep
    from workbench.sweeps.views import reattach

    folder = SweepDir(tmp_path / "sweep")
    folder.root.mkdir()
    study = optuna.create_study()
    trial = study.ask({"train.lr": optuna.distributions.CategoricalDistribution([1e-3, 2e-3])})
    run = RunDir(folder.trial(0)).prepare(_cfg(tmp_path, executor), executor)
    prepare(folder, run)
    trial.set_user_attr("run_dir", str(run.root))
    sweep = Sweep(folder, study, {"train.lr": [1e-3, 2e-3]}, _cfg(tmp_path, executor), trials=2, parallel=1,
                  metric="loss")
    reattach(sweep)
    return sweep, study, run


def test_a_trial_whose_driver_died_before_its_run_got_a_job_is_queued_again(tmp_path):
    """Killed between run.json and the job: no rank will ever run that folder.  The trial runs again
    with the same values; the folder says why it never ran."""
    def killed_while_writing(folder: SweepDir, run: RunDir) -> None:  # and while it held the journal's lock
        Path(f"{folder.journal}.lock").symlink_to(folder.journal)

    sweep, study, run = _resumed_sweep(tmp_path, "local", killed_while_writing)
    assert not Path(f"{sweep.dir.journal}.lock").is_symlink()  # the dead driver's lock is not waited for
    old, again = study.get_trials(deepcopy=False)
    assert old.state.name == "FAIL" and old.user_attrs["outcome"] == "requeued" and again.state.name == "WAITING"
    assert again.system_attrs["fixed_params"] == dict(old.params) and not sweep.active
    assert "driver stopped while starting" in run.read_meta()["cancelled_by"]
    assert any("trial 0 queued again: its run never started" in line for line in sweep.events)


def test_a_slurm_trial_prepared_for_an_element_never_answered_is_handed_to_it_on_resume(tmp_path):
    """Killed between the run folder naming its element (JOB_I) and the answer: the element still
    waits; the new driver answers it with that run instead of binding it to another trial."""
    def prepared_for_element(folder: SweepDir, run: RunDir) -> None:
        say_waiting(folder, "77_1")
        run.record_job("77_1", sweep_array="77")

    sweep, study, run = _resumed_sweep(tmp_path, "slurm", prepared_for_element)
    bound = wait_bound(SweepDir(tmp_path / "sweep"), "77_1")  # answered: returns at once
    assert bound["run_dir"] == str(run.root) and bound["trial"] == 0
    assert list(sweep.active) == [0] and [t.state.name for t in study.get_trials()] == ["RUNNING"]
    assert any("trial 0 followed again (handed to its element)" in line for line in sweep.events)


def _modules_named(data: bytes) -> set[str]:
    """The modules a pickle names by reference (what its loader imports)."""
    import pickletools

    ops = list(pickletools.genops(data))
    named = {str(arg).split(" ")[0] for op, arg, _ in ops if op.name in ("GLOBAL", "INST")}
    return named | {arg for _, arg, _ in ops if isinstance(arg, str) and arg.startswith("workbench.")}


def test_what_a_sweep_pickles_names_no_sweeps_module(tmp_path):
    """An array element (what submitit pickles for SLURM) is engine code; the sweep's payload.pkl holds the
    user's task or function: no pickle names workbench.sweeps (or the old workbench.launch.sweep*),
    so sweep folders written before or after a move of the package still load."""
    import cloudpickle

    from workbench.engine.rendezvous import RankContract
    from workbench.engine.sweep_element import SweepElement
    from workbench.sweeps.study import read_work, write_work

    element = cloudpickle.dumps(SweepElement(str(tmp_path), RankContract(local=False), 1))
    folder = SweepDir(tmp_path / "sweep")
    folder.root.mkdir()
    write_work(folder, None, len, (1,))
    assert read_work(folder)["fn"] is len
    for data in (element, folder.payload_pickle.read_bytes()):
        named = _modules_named(data)
        assert not {m for m in named if m.startswith(("workbench.sweeps", "workbench.launch.sweep"))}, named
