"""Resuming a sweep folder a killed driver left (issue 30 item 6), without starting a run: a trial
asked for but given no values gets its grid point again; a torn last journal line is dropped and the
study goes on; a copied sweep folder names its own trials.  The killed driver itself, for real, is
tests/ddp/test_sweep_faults.py; the damaged files from a terminal, tests/process/test_sweep_cli.py."""

from __future__ import annotations

import shutil
import warnings

import pytest

import workbench
from tests.support.sweeps import SPACE, sweep_folder
from workbench.errors import DamagedFileWarning, RunFolderError
from workbench.runfolder.layout import SweepDir

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.timeout(60)

def _resumed(folder: SweepDir) -> workbench.Sweep:
    return workbench.Sweep.load(folder.root, background=False)  # reattach only: wait() would start runs


def test_a_trial_asked_for_without_values_gets_its_grid_point_again_and_every_point_stays(tmp_path):
    folder = sweep_folder(tmp_path, told=1, asked=1)
    seen = workbench.Sweep.load(folder.root, resume=False)
    asked = seen.study.get_trials()[1]
    assert asked.state.name == "RUNNING" and asked.params == {}  # what the killed driver left
    sweep = _resumed(folder)
    trials = sweep.study.get_trials()
    assert trials[1].state.name == "FAIL" and trials[1].user_attrs["outcome"] == "requeued"
    queued = [t for t in trials if t.state.name == "WAITING"]
    assert len(queued) == 1 and any("trial 1 queued again" in line for line in sweep.events), sweep.events
    while sweep.wants_trial():  # the rest of the grid, as the driver asks for it
        trial = sweep.study.ask()
        trial.suggest_categorical("train.lr", SPACE["train.lr"])
        sweep.study.tell(trial, 1.0)
    ran = sorted(t.params["train.lr"] for t in sweep.study.get_trials() if t.state.name == "COMPLETE")
    assert ran == SPACE["train.lr"]  # every point once: the asked one not lost, none twice


def test_a_torn_last_journal_line_is_dropped_and_the_sweep_goes_on(tmp_path):
    folder = sweep_folder(tmp_path, told=1)
    whole = folder.journal.read_bytes()
    with open(folder.journal, "ab") as fh:
        fh.write(b'{"op_code":5,"worker_id":"x","trial_id":0,"us')  # what a writer killed mid-line leaves
    with pytest.warns(DamagedFileWarning, match="last line was torn"):
        sweep = _resumed(folder)
    assert folder.journal.read_bytes()[:len(whole)] == whole
    sweep.study.enqueue_trial({"train.lr": 2e-3})  # the study writes on after the line before
    again = workbench.Sweep.load(folder.root, resume=False)
    assert [t.state.name for t in again.study.get_trials()] == ["COMPLETE", "WAITING"]


@pytest.mark.parametrize("damage, words", [
    (lambda f: f.journal.write_bytes(b""), "study.journal is damaged (it is empty)"),
    (lambda f: f.journal.unlink(), "study.journal is damaged (it is missing"),
    (lambda f: f.journal.write_bytes(b"garbage\n" + f.journal.read_bytes()), "(line 1 is not a JSON record)"),
    (lambda f: f.journal.write_bytes(b'{"op_code": 99}\n'), "study.journal is damaged (Optuna cannot read it back"),
    (lambda f: f.meta.write_bytes(b"{not json"), "sweep.json is damaged (it is not a JSON object)"),
    (lambda f: f.meta.write_bytes(b'{"space": 3}'), "sweep.json is damaged (space, trials, metric missing or of"),
    (lambda f: f.payload_pickle.write_bytes(b"garbage"), "payload.pkl is damaged (UnpicklingError"),
])
def test_a_damaged_sweep_file_is_one_line_naming_it_and_what_to_do(tmp_path, damage, words):
    folder = sweep_folder(tmp_path, told=1)
    damage(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, in the error: no warning beside it
        with pytest.raises(RunFolderError) as caught:
            _resumed(folder)
    message = str(caught.value)
    assert words in message and "\n" not in message, message
    assert "its trials' run folders stay readable" in message and "workbench.sweep(" in message


def test_a_copied_sweep_folder_names_its_own_trials_not_the_originals(tmp_path):
    folder = sweep_folder(tmp_path / "a", told=1)
    (folder.trial(0)).mkdir()
    copy = tmp_path / "b" / folder.root.name
    shutil.copytree(folder.root, copy)
    shutil.rmtree(folder.root)
    frame = workbench.Sweep.load(copy, resume=False).frame()
    assert frame["run"].tolist() == [str(copy / "trial-0")]


def test_a_sweep_recorded_with_absolute_trial_paths_reads_its_own_trials_when_copied(tmp_path):
    folder = sweep_folder(tmp_path / "a")
    study = workbench.Sweep.load(folder.root, resume=False).study
    trial = study.ask()
    trial.suggest_categorical("train.lr", SPACE["train.lr"])
    trial.set_user_attr("run_dir", str(folder.trial(0)))  # as sweeps before this change recorded it
    study.tell(trial, 1.0)
    copy = tmp_path / "b" / folder.root.name
    shutil.copytree(folder.root, copy)
    assert workbench.Sweep.load(copy, resume=False).frame()["run"].tolist() == [str(copy / "trial-0")]
