"""Watching a SLURM run while SLURM does not answer (its controller or accounting database is down):
everywhere a notebook user looks it is one line naming the job and carrying SLURM's own message,
never a traceback, and the views go on from the run folder.

SLURM's silence is real: the SLURM client binaries read a slurm.conf whose controller and
accounting ports are a closed loopback port, so `sacct` itself fails with its own words
("Connection refused").  No cluster is started.  The run folder is written as the ranks write it
(their status files and metrics), for a job id the cluster would have given; when its ranks end,
they say so the way ranks do (a final status and the summary).

What needs a cluster that answers again (the dashboard clearing its line when the controller comes
back) is in tests/slurm/test_slurm_unanswered_recovery.py."""

from __future__ import annotations

import html
import os
import re
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest

from tests.support.slurm_cluster import closed_port
from workbench.config import JobConfig
from workbench.errors import SubmitError
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.writer import JsonlWriter

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("slurm_clients")]

JOB_ID = "4242"
SACCT_SAID = re.compile(r"sacct failed \(exit \d+\): sacct: error: .*Connection refused")


@pytest.fixture
def slurm_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's environment (and a copy for commands) on a login node whose SLURM controller
    and accounting database do not answer."""
    port = closed_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    "AuthType=auth/munge\nMessageTimeout=2\nAccountingStorageType=accounting_storage/slurmdbd\n"
                    f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={port}\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=n1 Default=YES State=UP\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return {**os.environ, "SLURM_CONF": str(conf)}


def slurm_run(tmp_path: Path, steps: int = 10) -> RunDir:
    """The run folder of a 2-rank SLURM job half way: both ranks running at `steps`, beating now."""
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8, "max_steps": 100}, "dist": {"procs_per_node": 2},
                               "launch": {"executor": "slurm", "run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "slurm", job_id=JOB_ID)
    t0 = time.time() - steps
    for rank in range(2):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, steps + 1):
            loss = 2.0 / step
            writer.write({"rank": rank, "step": step, "time": t0 + step, "loss": loss, "loss_reduced": loss})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "running", "step": steps, "time": time.time()})
    return run


def ranks_finish(run: RunDir, steps: int = 10) -> None:
    """What the ranks write when they trained to the end."""
    for rank in range(2):
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": steps, "time": time.time()})
    write_json_atomic(run.summary, {"status": "finished"})


def shown_text(value: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", value))


def all_html(widget) -> list[str]:
    """The value of every HTML widget under `widget` (what the user reads)."""
    import ipywidgets as w

    found, todo = [], [widget]
    while todo:
        current = todo.pop()
        if isinstance(current, w.HTML):
            found.append(current.value)
        todo.extend(getattr(current, "children", ()))
    return found


def test_the_dashboard_says_one_line_keeps_following_the_run_folder_and_shows_the_end(tmp_path, slurm_down):
    from workbench.launch.executors import SlurmJob
    from workbench.launch.run import Run

    folder = slurm_run(tmp_path)
    run = Run.load(folder.root)
    refreshed, ended = threading.Event(), threading.Event()
    dash = run.dashboard(poll_s=0.2, autostart=False)
    dash.on_refresh(lambda state: (refreshed.set(), state.done and ended.set()))
    calls_before = SlurmJob.watcher.num_calls
    dash.start()
    try:
        assert refreshed.wait(60), "no refresh"
        banner = shown_text(dash.scheduler.value).strip()
        assert "\n" not in banner and dash.scheduler.layout.display != "none", banner
        assert banner.startswith(f"⚠ workbench: SLURM cannot be asked about job {JOB_ID}: "), banner
        assert SACCT_SAID.search(banner), banner
        assert "the run may still be running" in banner and "asks SLURM again every" in banner, banner
        assert dash.error.value == ""
        assert not any("Traceback" in value for value in all_html(dash.widget))
        assert "running" in shown_text(dash.eta.value) and "rank 1: running @ 10" in shown_text(dash.badges.value)
        # it keeps polling (and asking SLURM): the run may still be running
        for _ in range(3):
            refreshed.clear()
            assert refreshed.wait(30) and dash.running
        assert SlurmJob.watcher.num_calls > calls_before

        ranks_finish(folder)  # the ranks say how it ended: the dashboard shows it without SLURM's word
        assert ended.wait(60), "the dashboard did not see the ranks end"
        assert dash.state is not None and dash.state.done
        assert dash.state.state == "finished" and "finished" in shown_text(dash.eta.value)
        banner = shown_text(dash.scheduler.value)
        assert f"job {JOB_ID}" in banner and "every rank has said how the run ended" in banner, banner
        assert not any("Traceback" in value for value in all_html(dash.widget))
    finally:
        dash.stop()


def test_the_runs_table_and_runs_view_show_the_run_folders_state_and_the_one_line(tmp_path, slurm_down):
    import workbench
    from workbench.ui import RunsView

    folder = slurm_run(tmp_path)
    row = workbench.runs(tmp_path).set_index("name").loc[folder.root.name]
    assert (row["status"], row["steps"]) == ("running", 10), row.to_dict()  # not "unreadable"
    view = RunsView(tmp_path)
    view.select.value = (str(folder.root),)
    view._act("Open")  # the Open button
    try:
        assert shown_text(view.message.value) == f"dashboard of {folder.root.name}"
        dash = view.dashboard
        assert dash is not None
        state = dash.refresh()
        assert state.scheduler_error.startswith(f"SLURM cannot be asked about job {JOB_ID}: sacct failed")
        assert shown_text(dash.scheduler.value).strip().startswith("⚠ workbench: SLURM cannot be asked")
        assert not any("Traceback" in value for value in all_html(view.widget))
    finally:
        view.dashboard.stop()


def test_cancel_from_the_dashboard_is_one_line_when_scancel_cannot_reach_slurm(tmp_path, slurm_down):
    from workbench.launch.run import Run

    run = Run.load(slurm_run(tmp_path).root)
    dash = run.dashboard(autostart=False)
    dash.cancel()  # the button's callback: it must not raise into the kernel's log
    banner = shown_text(dash.scheduler.value).strip()
    assert banner.startswith("⚠ workbench: the run was not cancelled: ") and "\n" not in banner, banner
    assert SACCT_SAID.search(banner) and "the run may still be running" in banner, banner
    assert not dash.cancel_button.disabled  # nothing was cancelled: it can be pressed again


def test_run_status_is_one_line_and_the_repr_says_slurm_is_not_answering(tmp_path, slurm_down):
    from workbench.launch.run import Run

    run = Run.load(slurm_run(tmp_path).root)
    with pytest.raises(SubmitError) as caught:
        run.status()  # asked directly: SLURM's answer is the answer, in one line
    assert SACCT_SAID.match(str(caught.value)) and "\n" not in str(caught.value), caught.value
    assert repr(run) == f"Run({str(run.folder)!r}, running (SLURM not answering))"
    status, ended = run.live_status()  # what a view reads: the run folder's status, and why SLURM is not in it
    assert (status.state, status.step, ended) == ("running", 10, False)
    assert status.scheduler_error.startswith(f"SLURM cannot be asked about job {JOB_ID}: sacct failed")
    plot = run.plot(interactive=True)  # the interactive figure reads the run folder: no error for SLURM
    assert plot.live_run and len(plot.data.ranks) == 2
    with pytest.raises(RuntimeError, match="is running: no summary yet"):
        run.result()


def test_run_wait_warns_once_and_goes_on_until_the_ranks_say_how_it_ended(tmp_path, slurm_down, monkeypatch):
    from workbench.launch import run as run_module

    monkeypatch.setattr(run_module, "SCHEDULER_RETRY_S", 0.2)  # ask SLURM again often: many polls, one warning
    from workbench.launch.executors import SlurmJob

    folder = slurm_run(tmp_path)
    run = run_module.Run.load(folder.root)
    asked = SlurmJob.watcher.num_calls
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(TimeoutError):
            run.wait(timeout=2.0, poll_s=0.1)
    # asked again every SCHEDULER_RETRY_S, not after submitit's backoff (2 s at first, then up to 10 min)
    assert SlurmJob.watcher.num_calls - asked >= 3, SlurmJob.watcher.num_calls - asked
    mine = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    said = [str(w.message) for w in mine]
    assert len(said) == 1, said
    assert said[0].startswith(f"SLURM cannot be asked about job {JOB_ID}: sacct failed") and "\n" not in said[0]
    assert "the run may still be running" in said[0] and mine[0].filename == __file__  # points at the user's line

    polls: list[str] = []
    timer = threading.Timer(1.0, ranks_finish, [folder])
    timer.start()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            status = run.wait(timeout=60, poll_s=0.1, on_poll=lambda r: polls.append(r.latest_status.state))
    finally:
        timer.cancel()
    assert status.state == "finished" and status.scheduler_error, status
    assert polls[0] == "running" and polls[-1] == "finished"
    assert run.result() == {"status": "finished"} and run.exception() is None  # what follows wait() works too


def _workbench(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["workbench", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=100)


def test_the_cli_show_is_one_line_and_follow_warns_in_one_line_then_follows(tmp_path, slurm_down):
    folder = slurm_run(tmp_path)
    shown = _workbench(["show", str(folder.root)], slurm_down, tmp_path)
    assert shown.returncode == 2, shown
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: sacct failed (exit 1): sacct: error: "), lines

    ranks_finish(folder)
    followed = _workbench(["follow", str(folder.root)], slurm_down, tmp_path)
    assert followed.returncode == 0, followed
    warned = [line for line in followed.stderr.splitlines() if line.startswith("workbench: warning: ")]
    assert len(warned) == 1 and warned[0].startswith(f"workbench: warning: SLURM cannot be asked about job {JOB_ID}: "
                                                     "sacct failed (exit 1): sacct: error: "), followed.stderr
    assert "Traceback" not in followed.stderr and "finished" in followed.stdout, followed
