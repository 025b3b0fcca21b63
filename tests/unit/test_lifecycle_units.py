"""Fast tests of the pieces the lifecycle runs rely on: ending a process group by recorded pid, the
stderr traceback reader, the disk-full wording and reserve, cancel-versus-failure, the restart
config field, the event fold of restarts and resumes, and provenance."""

from __future__ import annotations

import errno

import pytest

from workbench.config import JobConfig
from workbench.errors import ConfigError
from workbench.launch.status import overall_state
from workbench.runfolder.events import EventSummary
from workbench.runfolder.failures import describe, disk_full_error, last_traceback
from workbench.runfolder.layout import RunDir, write_json_atomic

pytestmark = pytest.mark.timeout(60)






def test_the_last_traceback_on_stderr_gives_type_message_and_frames():
    text = ("noise\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\nKeyError: 'x'\n"
            "more noise\nTraceback (most recent call last):\n  File \"b.py\", line 2, in f\n    g()\n"
            "mymod.BadThing: it broke: badly\nafter\n")
    kind, message, frames = last_traceback(text)
    assert (kind, message) == ("BadThing", "it broke: badly")
    assert "b.py" in frames and "a.py" not in frames and "after" not in frames
    assert last_traceback("no traceback here") is None


def test_a_full_disk_is_named_with_its_path_wherever_it_was_raised():
    cause = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise cause
        except OSError:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from None
    except RuntimeError as wrapped:
        wrapped.__context__ = cause
        assert describe(wrapped) == ("OSError", "disk full (No space left on device)")
    named = disk_full_error("/runs/x/checkpoints/step-00000010.pt", cause)
    assert describe(named) == ("OSError", "disk full (no space left on device) writing "
                                          "/runs/x/checkpoints/step-00000010.pt")
    assert describe(ValueError("bad")) == ("ValueError", "bad")




def test_a_cancel_after_a_failure_does_not_hide_it_and_teardown_errors_after_a_cancel_are_moot(tmp_path):
    run = RunDir(tmp_path).create()
    write_json_atomic(run.error(1), {"rank": 1, "type": "ValueError", "message": "bad", "time": 100.0})
    assert overall_state(run, [], job_done=True, cancelled=200.0) == "failed"
    assert overall_state(run, [], job_done=True, cancelled=50.0) == "cancelled"
    assert overall_state(run, [], job_done=False, cancelled=None) == "failed"


def test_a_cancel_by_a_sweeps_pruner_is_the_state_pruned_and_ends_the_run(tmp_path):
    from workbench.launch.status import TERMINAL, RunStatus

    run = RunDir(tmp_path).create()
    assert overall_state(run, [], job_done=True, cancelled=50.0, pruned=True) == "pruned"
    assert overall_state(run, [], job_done=True, cancelled=50.0, pruned=False) == "cancelled"
    assert overall_state(run, [], job_done=False, cancelled=50.0, pruned=True) == "pending"  # still stopping
    write_json_atomic(run.error(1), {"rank": 1, "type": "ValueError", "message": "bad", "time": 10.0})
    assert overall_state(run, [], job_done=True, cancelled=50.0, pruned=True) == "failed"  # it failed first
    assert "pruned" in TERMINAL and RunStatus("pruned").done and RunStatus("pruned").eta_s == 0.0


def test_max_restarts_is_a_checked_launch_field():
    assert JobConfig().launch.max_restarts == 0
    assert JobConfig.from_dict({"launch": {"max_restarts": 2}}).launch.max_restarts == 2
    with pytest.raises(ConfigError, match="launch.max_restarts: must be >= 0"):
        JobConfig.from_dict({"launch": {"max_restarts": -1}})
    assert "launch.max_restarts" in JobConfig.docs()


def test_events_fold_restarts_resumes_and_skipped_checkpoints():
    summary = EventSummary().fold([
        {"event": "checkpoint_skipped", "rank": 0, "path": "c/step-20.pt", "reason": "BadZipFile"},
        {"event": "resume", "rank": 0, "path": "c/step-10.pt"},
        {"event": "resume", "rank": 1, "path": "c/step-10.pt"},
        {"event": "restart", "rank": 0, "restart": 1, "failures": [{"rank": 1, "type": "RuntimeError"}]}])
    assert summary.resumed_from == "c/step-10.pt"
    assert summary.skipped_checkpoints == ["c/step-20.pt: BadZipFile"]
    assert summary.restarts[0]["failures"][0]["rank"] == 1


def test_archived_failures_stay_apart_from_the_current_attempt(tmp_path):
    run = RunDir(tmp_path).create()
    write_json_atomic(run.error(1), {"rank": 1, "attempt": 0})
    run.archive_errors()
    write_json_atomic(run.error(0), {"rank": 0, "attempt": 1})
    run.archive_errors()
    assert run.ranks_with("errors") == []
    assert [list(files) for files in run.archived_errors()] == [[1], [0]]




def test_a_rank_that_never_reported_is_explained_from_its_stderr(tmp_path):
    """Nothing in errors/ or status/: the agent itself failed before its rank could report."""
    from workbench.launch.run import Run

    run = RunDir(tmp_path / "run").create()
    write_json_atomic(run.meta, {"executor": "local", "world_size": 2})
    (run.logs / "4242_1_log.err").write_text(
        "submitit INFO starting\nTraceback (most recent call last):\n  File \"_submit.py\", line 3, in <module>\n"
        "ModuleNotFoundError: No module named 'workbench'\n")
    handle = Run(run.root)  # no job: it has ended
    assert handle.status().state == "failed"
    failure = handle.exception()
    assert (failure.rank, failure.type) == (1, "ModuleNotFoundError") and "workbench" in failure.message
    assert "_submit.py" in failure.traceback
