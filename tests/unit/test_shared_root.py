"""A run root shared with others (a group's project folder) cannot turn the workbench against its user
(issue 30): no write follows a link planted where the workbench writes (item 2), no pickle is read from
a folder another user owns or others can write (item 3), and a FIFO, a device or a deeply nested file
in a run folder is refused or survived, never waited on (item 5).  Each case is planted as the trial
planted it: another owner by os.chown (the tests run as root), mode 0777, os.mkfifo, a symlink."""

from __future__ import annotations

import json
import os
import pickle
import stat
import warnings
from pathlib import Path

import pandas as pd
import pytest

import workbench
from tests.support.runs import write_run
from workbench.errors import NotWrittenError, UntrustedFileError
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir
from workbench.runfolder.private import open_private, open_regular, replacing, write_atomic
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(60)  # a reader that waits on a FIFO fails here instead of hanging
STRANGER = 12345
"""A uid no one on this machine has: the owner of a planted folder."""


class _Planted:
    """A pickle that makes a folder when unpickled: whether it ran shows on disk."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (str(self.marker), 0o700, True)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


# --- item 2: no write follows a link -------------------------------------------------------------------
def test_export_metrics_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    folder = write_run(tmp_path, "run", 1, "none", steps=5)
    victim = _victim(tmp_path)
    (folder / "exports").mkdir()
    (folder / "exports" / "metrics.csv").symlink_to(victim)
    written = Run.load(folder).export_metrics()
    assert written == folder / "exports" / "metrics.csv"
    assert victim.read_text() == "precious\n"  # the trial: the target was overwritten
    assert not written.is_symlink() and stat.S_IMODE(written.stat().st_mode) == 0o600
    assert len(pd.read_csv(written)) == 5


def test_the_dashboards_csv_button_writes_the_run_file_not_the_links_target(tmp_path, monkeypatch):
    from workbench.ui import Dashboard

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    folder = write_run(tmp_path, "run", 1, "none", steps=5)
    victim = _victim(tmp_path)
    (folder / "exports").mkdir()
    (folder / "exports" / "metrics.csv").symlink_to(victim)
    dash = Dashboard(Run.load(folder), autostart=False)
    dash.downloads["csv"].click()
    assert str(victim) not in dash.download_link.value and "metrics.csv" in dash.download_link.value
    assert victim.read_text() == "precious\n"


def test_exports_that_is_a_link_to_another_folder_is_not_written_through(tmp_path):
    folder = write_run(tmp_path, "run", 1, "none", steps=5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "exports").symlink_to(elsewhere)
    with pytest.raises(NotWrittenError, match="exports: a symbolic link"):
        Run.load(folder).export_metrics()
    assert not list(elsewhere.iterdir())


def test_a_figure_and_an_atomic_file_replace_a_link_in_their_place(tmp_path):
    from matplotlib.figure import Figure

    from workbench.results.plots import save_figure

    def stacks(path: Path) -> None:
        with replacing(path, "w") as fh:
            fh.write("x")

    victim = _victim(tmp_path)
    for path, write in ((tmp_path / "loss.png", lambda p: save_figure(Figure(), p)),
                        (tmp_path / "row.json", lambda p: write_atomic(p, b"{}")), (tmp_path / "stacks.txt", stacks)):
        path.symlink_to(victim)
        write(path)
        assert not path.is_symlink(), path
        assert victim.read_text() == "precious\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left beside


@pytest.mark.parametrize("plant", ["symlink", "fifo", "dev-null-link"])
def test_a_file_appended_to_is_never_written_through_a_link_or_a_fifo(tmp_path, plant):
    victim = _victim(tmp_path)
    path = tmp_path / "rank0.jsonl"
    if plant == "symlink":
        path.symlink_to(victim)
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    with pytest.raises(NotWrittenError, match="not a regular file: the workbench does not write through it"):
        JsonlWriter(path)
    with pytest.raises(NotWrittenError):
        open_private(path, "ab")
    assert victim.read_text() == "precious\n"


def test_open_private_still_appends_to_and_overwrites_its_own_files(tmp_path):
    path = tmp_path / "log.txt"
    with open_private(path, "a") as fh:
        fh.write("one\n")
    with open_private(path, "ab") as fh:
        fh.write(b"two\n")
    assert path.read_text() == "one\ntwo\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    with open_private(path, "w") as fh:
        fh.write("new\n")
    assert path.read_text() == "new\n"


# --- item 10: one line, not a bare OSError ---------------------------------------------------------------
def test_export_metrics_where_it_cannot_write_is_one_line(tmp_path):
    folder = write_run(tmp_path, "run", 1, "none", steps=5)
    (tmp_path / "a-file").write_text("")
    for target in (tmp_path / "a-file" / "metrics.csv", Path("/proc/metrics.csv")):
        with pytest.raises(NotWrittenError, match=r"metrics cannot be written there \(.+\); give another") as caught:
            Run.load(folder).export_metrics(target)
        assert "\n" not in str(caught.value)


def test_submit_into_a_folder_it_cannot_make_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    for run_dir in (tmp_path / "a-file" / "run", Path("/proc/run")):
        with pytest.raises(workbench.ConfigError, match=rf"cannot make the run folder {run_dir} \(.+\); check the"):
            workbench.submit(workbench.JobConfig(), run_dir=run_dir)


def test_check_warns_of_a_task_name_from_the_standard_library(tmp_path, capsys):
    from workbench.cli import main

    config = tmp_path / "job.yaml"
    config.write_text("task:\n  name: os:system\n")
    main(["check", str(config)])
    said = capsys.readouterr().err
    assert "warning: task.name: os:system is a function of Python's standard library, not a task factory" in said
    config.write_text("task:\n  name: builtins:eval\n")
    main(["check", str(config)])
    assert "builtins:eval is a function of Python's standard library" in capsys.readouterr().err


# --- item 3: no pickle from a folder the user does not own -----------------------------------------------
def _run_with_planted_results(tmp_path: Path) -> tuple[Path, Path]:
    folder = write_run(tmp_path, "theirs", 2, "none", steps=3)
    marker = tmp_path / "ran"
    for rank in (0, 1):
        path = RunDir(folder).result(rank)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(pickle.dumps(_Planted(marker)))
    return folder, marker


def _chown_tree(folder: Path, uid: int) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, uid, -1)


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another owner needs root")
def test_results_of_a_folder_another_user_owns_are_not_unpickled(tmp_path):
    folder, marker = _run_with_planted_results(tmp_path)
    _chown_tree(folder, STRANGER)
    run = Run.load(folder)
    with pytest.raises(UntrustedFileError, match=r"results/rank0.pkl: not unpickled: the folder is owned by "
                                                 rf"uid {STRANGER}, not by you") as caught:
        run.results()
    assert "trust=True" in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists()
    assert run.results(trust=True) == [None, None] and marker.is_dir()  # trusted: read as asked


def test_results_of_a_folder_others_can_write_are_not_unpickled(tmp_path):
    folder, marker = _run_with_planted_results(tmp_path)
    os.chmod(folder, 0o777)
    with pytest.raises(UntrustedFileError, match=r"the folder is writable by others \(mode 0777\)"):
        Run.load(folder).results()
    os.chmod(folder, 0o700)
    os.chmod(folder / "results" / "rank1.pkl", 0o666)
    with pytest.raises(UntrustedFileError, match=r"results/rank1.pkl is writable by others"):
        Run.load(folder).results()
    assert not marker.exists()


def test_a_result_that_is_a_link_is_not_unpickled(tmp_path):
    folder, marker = _run_with_planted_results(tmp_path)
    elsewhere = tmp_path / "elsewhere.pkl"
    os.replace(RunDir(folder).result(0), elsewhere)
    RunDir(folder).result(0).symlink_to(elsewhere)
    with pytest.raises(UntrustedFileError, match="rank0.pkl is not a regular file"):
        Run.load(folder).results()
    assert not marker.exists()


def test_the_users_own_private_results_read_as_before(tmp_path):
    folder = write_run(tmp_path, "mine", 2, "none", steps=3)
    for rank in (0, 1):
        write_atomic(RunDir(folder).result(rank), pickle.dumps({"rank": rank}))
    assert Run.load(folder).results() == [{"rank": 0}, {"rank": 1}]


def _sweep_with_planted_task(tmp_path: Path) -> tuple[Path, Path]:
    optuna = pytest.importorskip("optuna")
    from workbench.config.sections import JobConfig
    from workbench.runfolder.layout import SweepDir
    from workbench.sweeps.study import storage

    folder = SweepDir(tmp_path / "sweep-theirs")
    folder.root.mkdir(mode=0o700)
    write_atomic(folder.config, JobConfig().to_yaml().encode())
    folder.update_meta(name=folder.root.name, space={"train.lr": {"grid": [1e-3, 2e-3]}}, metric="loss",
                       direction="minimize", trials=2, parallel=1, executor="local", sampler="grid", pruner="none")
    optuna.create_study(storage=storage(folder), study_name="sweep")
    marker = tmp_path / "ran"
    write_atomic(folder.payload_pickle, pickle.dumps({"task": _Planted(marker), "fn": None, "fn_args": ()}))
    return folder.root, marker


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another owner needs root")
def test_a_sweep_another_user_owns_opens_read_only_without_its_pickle_and_is_not_resumed(tmp_path, capsys):
    from workbench.cli import main
    from workbench.runfolder.layout import SweepDir
    from workbench.sweeps.driver import Sweep
    from workbench.sweeps.study import read_work

    folder, marker = _sweep_with_planted_task(tmp_path)
    _chown_tree(folder, STRANGER)
    os.chmod(folder, 0o777)
    view = Sweep.load(folder, resume=False)  # the trial: this read payload.pkl
    assert view.readonly and view.task is None and not marker.exists()
    with pytest.raises(UntrustedFileError, match=rf"payload.pkl: not unpickled: the folder is owned by uid {STRANGER}"):
        Sweep.load(folder, resume=True, background=False)
    assert main(["sweep", "--resume", str(folder)]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("workbench:")]
    assert len(said) == 1 and "payload.pkl: not unpickled" in said[0] and "--trust" in said[0]
    assert not marker.exists()
    read_work(SweepDir(folder), trust=True)  # what --trust and trust=True do
    assert marker.is_dir()


# --- item 5: readers open regular files only ----------------------------------------------------------
def test_a_fifo_named_row_json_does_not_hang_the_runs_table(tmp_path):
    write_run(tmp_path, "fine", 1, "none", steps=3)
    hostile = write_run(tmp_path, "hostile", 1, "none", steps=3)
    os.mkfifo(RunDir(hostile).row_cache)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        table = workbench.runs(tmp_path)
    assert sorted(table["name"]) == ["fine", "hostile"]
    assert set(table["status"]) == {"finished"}


@pytest.mark.parametrize("plant", ["fifo", "dev-zero-link"])
def test_a_fifo_or_a_device_in_a_run_files_place_reads_as_unreadable_at_once(tmp_path, plant):
    folder = write_run(tmp_path, "hostile", 2, "none", steps=3)
    run = RunDir(folder)
    for path in (run.status(1), run.metrics(1), run.config):
        path.unlink()
        os.mkfifo(path) if plant == "fifo" else path.symlink_to("/dev/zero")
    handle = Run.load(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = handle.metrics()
        status, _ = handle.live_status()
    assert set(frame["rank"]) == {0} and status.state
    assert any("not a regular file" in str(w.message) for w in caught)
    with pytest.raises(workbench.ConfigError, match="config.yaml: cannot read it"):
        JobConfigFromYaml(run.config)
    with pytest.raises(OSError, match="not a regular file"):
        open_regular(run.status(1))


def JobConfigFromYaml(path: Path):  # noqa: N802 - reads as the call it makes
    return workbench.JobConfig.from_yaml(path)


@pytest.mark.parametrize("plant", ["deep", "fifo", "dev-zero-link"])
def test_a_hostile_plot_json_does_not_stop_a_dashboard(tmp_path, monkeypatch, plant):
    from workbench.ui import Dashboard

    config = tmp_path / "config" / "workbench"
    config.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    plot = config / "plot.json"
    if plant == "deep":
        plot.write_text("[" * 100_000 + "]" * 100_000)
    elif plant == "fifo":
        os.mkfifo(plot)
    else:
        plot.symlink_to("/dev/zero")
    folder = write_run(tmp_path, "run", 1, "none", steps=5)
    dash = Dashboard(Run.load(folder), autostart=False)
    assert dash.widget is not None


def test_a_deeply_nested_run_file_is_damaged_not_a_recursion_error(tmp_path):
    folder = write_run(tmp_path, "deep", 1, "none", steps=3)
    run = RunDir(folder)
    run.row_cache.write_text("[" * 100_000 + "]" * 100_000)
    run.status(0).write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = workbench.runs(tmp_path)
        status, _ = Run.load(folder).live_status()
    assert table["name"].tolist() == ["deep"] and status.state
    assert any("nested too deeply" in str(w.message) for w in caught)
    assert json.loads(run.row_cache.read_text())  # the damaged row was rebuilt


def test_the_tensorboard_mirror_and_export_do_not_write_through_a_planted_folder_link(tmp_path):
    """TensorBoard names its own event files, so a link can only be planted where its folder goes
    (issue 30: writers not yet covered by 'no write follows a link')."""
    from workbench.config import JobConfig
    from workbench.engine.mirrors import TensorBoardMirror

    folder = write_run(tmp_path, "run", 2, "none")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "tensorboard").symlink_to(elsewhere)
    with pytest.raises(NotWrittenError, match="tensorboard: a symbolic link, not a folder"):
        TensorBoardMirror(JobConfig(), RunDir(folder), 0)
    logdir = tmp_path / "tb"
    logdir.mkdir()
    (logdir / "rank0").symlink_to(elsewhere)
    with pytest.raises(NotWrittenError, match="rank0: a symbolic link, not a folder"):
        Run.load(folder).to_tensorboard(logdir)
    assert not list(elsewhere.iterdir())
    (logdir / "rank0").unlink()
    Run.load(folder).to_tensorboard(logdir)  # the user's own folders: written as before
    assert list((logdir / "rank0").iterdir()) and list((logdir / "rank1").iterdir())


def test_a_sweep_whose_journal_is_a_link_is_not_resumed_through_it(tmp_path):
    from tests.support.sweeps import sweep_folder

    pytest.importorskip("optuna")
    folder = sweep_folder(tmp_path, told=1)
    target = tmp_path / "target.journal"
    target.write_bytes(folder.journal.read_bytes())
    folder.journal.unlink()
    folder.journal.symlink_to(target)
    before = target.read_bytes()
    with pytest.raises(NotWrittenError, match="study.journal: a symbolic link"):
        workbench.Sweep.load(folder.root, background=False)
    assert target.read_bytes() == before
    assert len(workbench.Sweep.load(folder.root, resume=False).frame()) == 1  # a read-only view reads it


def test_a_rank_does_not_unpickle_a_payload_pkl_planted_in_a_folder_others_can_write(tmp_path):
    """The rank's own read of payload.pkl (issue 30: the rank side of 'no pickle from untrusted folders')."""
    from workbench.engine.tasks import load_task_factory

    folder = write_run(tmp_path, "run", 1, "none", steps=2)
    marker = tmp_path / "ran"
    write_atomic(RunDir(folder).payload_pickle, pickle.dumps(_Planted(marker)))
    os.chmod(folder, 0o777)
    with pytest.raises(UntrustedFileError, match=r"payload.pkl: not unpickled: the folder is writable by others"):
        load_task_factory(RunDir(folder))
    assert not marker.exists()
    os.chmod(folder, 0o700)
    load_task_factory(RunDir(folder))  # the submitter's own private folder: read as before
    assert marker.is_dir()
