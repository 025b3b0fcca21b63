"""Each fact about a run has one owner, so the Run handle, the CLI, the dashboard and the report
cannot disagree.  Run folders are written by hand here (no processes): status files, metrics and
events exactly as the ranks write them."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pandas as pd
import pytest

from workbench.config import JobConfig
from workbench.engine.monitor import RankMonitor
from workbench.errors import ConfigError
from workbench.launch.run import Run
from workbench.launch.status import run_status, step_rate
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.rankstate import RANK_STATES, SILENT_AFTER_S
from workbench.runfolder.writer import JsonlWriter

pytestmark = pytest.mark.timeout(60)


def _run_folder(tmp_path: Path, world: int = 2, **dist: float) -> RunDir:
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": world, **dist}, "launch": {"run_root": str(tmp_path)}})
    return RunDir(tmp_path / "run").prepare(cfg, "local")


def _status(run: RunDir, rank: int, state: str, step: int, age_s: float = 1.0) -> None:
    write_json_atomic(run.status(rank), {"rank": rank, "state": state, "step": step, "time": time.time() - age_s,
                                         "pid": 1, "host": "node", "attempt": 0})


def _metrics(run: RunDir, rank: int, steps: range, step_time_s: float = 0.1, comm_s: float = 0.01) -> None:
    writer = JsonlWriter(run.metrics(rank))
    for step in steps:
        writer.write({"rank": rank, "step": step, "time": 1000.0 + 0.1 * step, "loss": 1.0, "step_time_s": step_time_s,
                      "comm_wait_s": comm_s, "data_time_s": 0.0, "samples_per_s": 320.0, "mem_mb": 100.0})
    writer.close()


def _events(run: RunDir, rank: int, records: list[dict]) -> None:
    writer = JsonlWriter(run.events(rank))
    for record in records:
        writer.write({"rank": rank, "time": time.time(), **record})
    writer.close()


# --- liveness ------------------------------------------------------------------------------------
def test_silent_then_lost_by_one_rule_and_one_message(tmp_path):
    run = _run_folder(tmp_path)
    _status(run, 0, "running", 5)
    _status(run, 1, "running", 5, age_s=SILENT_AFTER_S + 5)
    status = run_status(run, 2, job_done=False, cancelled=False, frames={})
    assert status.state == "running" and [r.silent for r in status.ranks] == [False, True]

    _status(run, 1, "running", 5, age_s=JobConfig().dist.lost_after_s + 5)
    status = run_status(run, 2, job_done=False, cancelled=False, frames={})
    assert status.ranks[1].state == "lost" and status.state == "failed"
    seen_from_outside = Run(run.root).exception(status)
    assert seen_from_outside.rank == 1 and seen_from_outside.type == "Lost"

    # the ranks' own watcher (rank 0 watches rank 1) says it with the same words
    monitor = RankMonitor(run, 0, 2)
    monitor._watch_neighbour()
    monitor.close()
    written = Run(run.root).exception(status)
    pattern = (r"rank 1 sent no heartbeat for \d+ s \(stopped answering: stopped or hung; "  # on another node:
               r"or killed by a signal, out of memory, or its node failed\)")  # both, as nothing else is known
    assert re.fullmatch(pattern, seen_from_outside.message)
    assert re.fullmatch(pattern + "; noticed by rank 0", written.message)


def test_a_rank_still_starting_gets_a_minute_before_it_is_lost_whatever_the_short_limit(tmp_path):
    """Importing torch and DDP's set-up hold the GIL for seconds, for much longer on a loaded machine:
    a short dist.lost_after_s (10 s) must not call a rank that is still starting lost."""
    from workbench.runfolder.rankstate import STARTING_LOST_S, is_lost, liveness

    assert not is_lost(30, 10, "starting") and is_lost(30, 10, "running")
    assert is_lost(STARTING_LOST_S + 1, 10, "starting") and is_lost(121, 120, "starting")
    assert liveness("starting", 30, 10) != "lost" and liveness("running", 30, 10) == "lost"


@pytest.mark.parametrize("there", [True, False])
def test_a_lost_rank_on_this_node_is_said_stopped_if_its_process_is_there_else_killed(tmp_path, there):
    """A rank that stopped beating while its process still exists stopped answering (SIGSTOP, or hung
    with all its threads); one whose process is gone was killed.  Said alike by the ranks' watcher
    and a reader.  (This test's own process stands for a stopped rank; the same pid with another start
    time is a process that is gone, its pid reused.)"""
    from workbench.proctree import Proc
    from workbench.runfolder.rankstate import node_name

    run = _run_folder(tmp_path)
    start = Proc.of(os.getpid()).start
    _status(run, 0, "running", 5)
    write_json_atomic(run.status(1), {"rank": 1, "state": "running", "step": 5, "time": time.time() - 65,
                                      "pid": os.getpid(), "pid_start": start if there else start + 1,
                                      "host": node_name(), "attempt": 0})
    status = run_status(run, 2, job_done=False, cancelled=False, frames={})
    seen_from_outside = Run(run.root).exception(status).message
    monitor = RankMonitor(run, 0, 2)
    monitor._watch_neighbour()
    monitor.close()
    written = Run(run.root).exception(status).message
    if there:
        pattern = (r"rank 1 stopped answering: no heartbeat for \d+ s, its process still there "
                   r"\(stopped, e\.g\. by SIGSTOP, or hung with all its threads\)")
    else:
        pattern = r"rank 1 sent no heartbeat for \d+ s and its process is gone \(killed by a signal, or out of memory\)"
    assert re.fullmatch(pattern, seen_from_outside), seen_from_outside
    assert re.fullmatch(pattern + "; noticed by rank 0", written), written
    assert ("killed" in written) is not there and ("SIGSTOP" in written) is there


def test_a_rank_named_hung_reads_hung_however_it_ended_without_a_word(tmp_path):
    """A rank named hung is what held the others up, however it was stopped then: with dist.on_hang: fail
    its error record says Hung, and its agent's SIGTERM may make it "interrupted" first; with warn only
    its status says so (`hung`), and the job ends with it still "running", or it stops itself when a
    peer's collective timed out under it ("aborted").  The per-rank summary says hung in each case.  An
    error of its own (killed: Lost) is what it says; ranks never named hung, or named but moving again
    when stopped, stay aborted, interrupted or lost."""
    run = _run_folder(tmp_path, world=7)
    ranks = [(0, "aborted", False, False), (1, "running", True, True), (2, "aborted", True, True),
             (3, "running", True, True), (4, "interrupted", False, False), (5, "interrupted", False, False),
             (6, "interrupted", True, False)]
    for rank, state, hung, stalled in ranks:
        write_json_atomic(run.status(rank), {"rank": rank, "state": state, "step": 7, "time": time.time() - 5,
                                             "pid": 1, "host": "node", "attempt": 0, "hung": hung,
                                             "stalled": stalled})
    for rank, kind in [(3, "Lost"), (4, "Hung")]:
        write_json_atomic(run.error(rank), {"rank": rank, "type": kind, "message": "...", "time": time.time(),
                                            "attempt": 0})
    status = run_status(run, 7, job_done=True, cancelled=False, frames={})
    assert [r.state for r in status.ranks] == ["aborted", "hung", "hung", "lost", "hung", "interrupted",
                                               "interrupted"]
    assert "ranks 0:aborted, 1:hung, 2:hung, 3:lost, 4:hung, 5:interrupted, 6:interrupted)" in str(status)


def test_the_runs_lost_after_s_is_the_one_limit_of_its_watcher_and_its_readers(tmp_path):
    """dist.lost_after_s: the ranks' watcher (RankMonitor, given it as the engine gives it), the
    status and the Run handle (reading the run's config) call a rank lost past the same limit."""
    run = _run_folder(tmp_path, lost_after_s=10)
    lost_after_s = JobConfig.from_yaml(run.config).dist.lost_after_s
    _status(run, 0, "running", 5)
    _status(run, 1, "running", 5, age_s=8)
    status = run_status(run, 2, job_done=False, cancelled=False, frames={}, lost_after_s=lost_after_s)
    assert [r.state for r in status.ranks] == ["running", "running"] and status.ranks[1].silent
    monitor = RankMonitor(run, 0, 2, lost_after_s=lost_after_s)
    monitor._watch_neighbour()
    assert not run.error(1).exists()
    assert "ended without reporting" in Run(run.root).exception().message  # the job ended 8 s after a beat

    _status(run, 1, "running", 5, age_s=12)
    status = run_status(run, 2, job_done=False, cancelled=False, frames={}, lost_after_s=lost_after_s)
    assert status.ranks[1].state == "lost" and status.state == "failed"
    assert "sent no heartbeat for 12 s" in Run(run.root).exception().message  # the handle read the config's 10 s
    monitor._watch_neighbour()
    monitor.close()
    assert run.read_error(1)["type"] == "Lost" and "noticed by rank 0" in run.read_error(1)["message"]


def test_lost_after_s_is_a_checked_dist_field():
    assert JobConfig().dist.lost_after_s == 60.0
    assert "dist.lost_after_s" in JobConfig.docs()
    with pytest.raises(ConfigError, match=r"dist.lost_after_s: must be >= 5, got 1.0; ranks beat every 2 s"):
        JobConfig.from_dict({"dist": {"lost_after_s": 1}})


def test_the_earliest_failure_is_blamed_not_a_rank_killed_after_it(tmp_path):
    run = _run_folder(tmp_path)
    write_json_atomic(run.error(1), {"rank": 1, "type": "ValueError", "message": "bad batch", "traceback": "tb",
                                     "time": time.time() - 100, "host": "node"})
    _status(run, 0, "running", 7, age_s=90)  # died later, in a collective, without a word
    _status(run, 1, "failed", 7, age_s=100)
    status = run_status(run, 2, job_done=True, cancelled=False, frames={})
    assert status.state == "failed" and status.ranks[0].state == "lost"
    failure = Run(run.root).exception(status)
    assert (failure.rank, failure.type) == (1, "ValueError")


# --- step, progress, badges ----------------------------------------------------------------------
def test_progress_step_is_the_slowest_ranks_step_and_badges_show_the_same(tmp_path):
    from workbench.ui.state import dashboard_state

    run = _run_folder(tmp_path)
    _status(run, 0, "running", 213)  # heartbeats lag behind the logged records
    _status(run, 1, "running", 190)
    _metrics(run, 0, range(1, 364))
    _metrics(run, 1, range(1, 201))
    handle = Run(run.root)
    status = handle.status()
    assert [r.step for r in status.ranks] == [363, 200]
    assert status.step == 200
    state = dashboard_state(status, job_done=False)
    assert state.step == min(b.step for b in state.badges) == 200
    assert [b.step for b in state.badges] == [363, 200]


def test_an_ended_script_whose_rank_0_alone_logged_is_at_rank_0s_step(tmp_path):
    """docs/sweeps.md has a script log on rank 0: rank 1 logs nothing.  Its ended run read "finished · no
    step logged" beside rank 0's 12 steps, and its sweep trial "steps 0" (a user trial).  A running run
    still waits for its slowest rank: one that has not logged yet may be behind."""
    run = _run_folder(tmp_path)
    _status(run, 0, "finished", 12)
    _status(run, 1, "finished", 0)
    _metrics(run, 0, range(1, 13))
    write_json_atomic(run.summary, {"status": "finished", "script": "train.py", "steps": 12})
    status = Run(run.root).status()
    assert status.state == "finished" and status.step == 12, status
    assert status.progress_line().startswith("finished · step 12"), status.progress_line()


def test_step_rate_is_measured_over_logged_time_not_poll_times():
    from workbench.launch.status import step_rate

    frame = pd.DataFrame({"step": range(1, 201), "time": [100.0 + 0.5 * i for i in range(200)]})
    assert step_rate({0: frame}) == pytest.approx(2.0)
    bursty = frame.assign(time=[100.0 + 0.5 * i + (0.4 if i % 2 else 0.0) for i in range(200)])
    assert step_rate({0: bursty}) == pytest.approx(2.0, rel=0.05)


# --- rank states ---------------------------------------------------------------------------------
def test_a_requeued_rank_is_known_to_the_status_and_the_badges(tmp_path):
    from workbench.ui.state import BADGE_COLOURS, dashboard_state

    run = _run_folder(tmp_path)
    _status(run, 0, "requeued", 40, age_s=200)
    _status(run, 1, "requeued", 40, age_s=200)
    status = run_status(run, 2, job_done=False, cancelled=False, frames={})
    assert [r.state for r in status.ranks] == ["requeued", "requeued"] and status.state == "running"
    state = dashboard_state(status, job_done=False)
    assert {b.colour for b in state.badges} == {BADGE_COLOURS["requeued"]}
    ended = run_status(run, 2, job_done=True, cancelled=False, frames={})
    assert ended.state == "failed"  # the scheduler gave up on it


def _luminance(colour: str) -> float:
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_every_rank_state_has_a_readable_badge_colour():
    from workbench.ui.state import BADGE_COLOURS

    assert set(BADGE_COLOURS) == set(RANK_STATES)
    for state, colour in BADGE_COLOURS.items():
        contrast = 1.05 / (_luminance(colour) + 0.05)  # white text on the badge
        assert contrast >= 4.5, f"{state}: white on {colour} has contrast {contrast:.2f}"


# --- stragglers ----------------------------------------------------------------------------------
def test_live_health_line_and_report_give_one_straggler_verdict(tmp_path):
    from workbench.results.analysis import format_report

    run = _run_folder(tmp_path)
    _metrics(run, 0, range(1, 60), step_time_s=0.100, comm_s=0.04)  # waits for rank 1 in the all-reduce
    _metrics(run, 1, range(1, 60), step_time_s=0.100, comm_s=0.001)
    # the ranks' live check flagged each rank once during the run: history, not the verdict
    _events(run, 0, [{"event": "straggler", "straggler_rank": 0, "slower_by": 0.3},
                     {"event": "straggler", "straggler_rank": 1, "slower_by": 0.5}])
    handle = Run(run.root)
    health = handle.health()
    report = handle.report()
    assert list(health["stragglers"]) == report["stragglers"]["rank"].tolist() == [1]
    text = format_report(report)
    assert "stragglers: rank 1" in text and "the ranks' live checks saw: 2 straggler warnings" in text


def test_straggler_threshold_comes_from_the_config(tmp_path):
    run = _run_folder(tmp_path)
    _metrics(run, 0, range(1, 60), step_time_s=0.100, comm_s=0.02)
    _metrics(run, 1, range(1, 60), step_time_s=0.100, comm_s=0.001)  # 0.099 vs 0.080: 24% slower
    assert list(Run(run.root).health()["stragglers"]) == [1]  # default threshold 0.2
    cfg = JobConfig.from_yaml(run.config).replace(dist__straggler_threshold=0.3)
    cfg.to_yaml(run.config)
    assert Run(run.root).health()["stragglers"] == {}


# --- one reader ----------------------------------------------------------------------------------
def test_dashboard_report_and_handle_share_one_metrics_reader(tmp_path, monkeypatch):
    from workbench.runfolder import reader as stream
    from workbench.ui.state import read_state

    run = _run_folder(tmp_path)
    _status(run, 0, "finished", 59)
    _status(run, 1, "finished", 59)
    _metrics(run, 0, range(1, 60))
    _metrics(run, 1, range(1, 60))
    made = []
    original = stream.RankFrames.__init__

    def counting(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(stream.RankFrames, "__init__", counting)
    handle = Run(run.root)
    state = read_state(handle, max_points=100)
    records = handle.metric_frames.records
    handle.report()
    handle.metrics()
    assert len(made) == 1 and state.records == records == 118
    assert handle.metric_frames.records == records  # the report read nothing twice


def test_events_are_folded_once_for_total_steps_and_health(tmp_path):
    run = _run_folder(tmp_path)
    _events(run, 0, [{"event": "start", "total_steps": 80}, {"event": "sync_check", "in_sync": True},
                     {"event": "shard_check", "ok": True},
                     {"event": "warning", "message": "DistributedSampler iterated again"}])
    _events(run, 1, [{"event": "start", "total_steps": 999}])  # only rank 0 plans the run
    handle = Run(run.root)
    assert handle.status().total_steps == 80
    health = handle.health()
    assert health["in_sync"] is True and health["shards_ok"] is True
    assert health["warnings"] == ["rank 0: DistributedSampler iterated again"]
    _events(run, 0, [{"event": "start", "total_steps": 120}])  # a resume re-plans it
    assert handle.status().total_steps == 120


def test_a_run_that_logs_no_metric_says_so_instead_of_step_zero(tmp_path):
    run = _run_folder(tmp_path)
    for rank in (0, 1):
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": 0, "time": time.time(),
                                             "output_lines": 240})
    text = str(Run(run.root).status())
    assert text == "finished (no metrics logged; 480 lines of output; ranks 0:finished, 1:finished)"


def test_a_script_that_logs_loss_without_step_times_is_not_called_empty(tmp_path):
    from workbench.results.analysis import format_report

    run = _run_folder(tmp_path)
    for rank in (0, 1):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, 481):
            writer.write({"rank": rank, "step": step, "time": 1000.0 + step, "loss": 1.0 / step})
        writer.close()
    for rank in (0, 1):
        _status(run, rank, "finished", 0)  # the script never told the heartbeat its step
    handle = Run(run.root)
    assert str(handle.status()) == "finished (step 480; ranks 0:finished@480, 1:finished@480)"
    assert format_report(handle.report()).startswith("step analysis: 960 records logged, none with a step time")



def test_the_end_table_and_the_progress_use_every_value_logged_at_a_step(tmp_path):
    """A script that logs its loss and then its lr at each step (two records a step), as the Hugging
    Face Trainer logs its summary at the last step: the end table's final loss is the last loss logged,
    named after the metric the job logs, and the status counts steps, not records."""
    from workbench.cli.printing import per_rank_table

    run = _run_folder(tmp_path)
    for rank in (0, 1):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, 11):
            writer.write({"rank": rank, "step": step, "time": 1000.0 + step, "train_loss": 1.0 / step + rank})
            writer.write({"rank": rank, "step": step, "lr": 0.1})
        writer.write({"rank": rank, "step": 10, "time": 1010.5, "train_runtime": 9.5})  # the summary, same step
        if rank:
            writer.write({"rank": rank, "step": 11, "lr": 0.1})  # a step logged without a time
        writer.close()
        _status(run, rank, "running", 10)
    handle = Run(run.root)
    table = per_rank_table(handle.metrics())
    assert list(table.columns[:2]) == ["step", "final_train_loss"]
    assert table["final_train_loss"].tolist() == [0.1, 1.1] and table["step"].tolist() == [10, 11]
    status = handle.status()
    assert status.step == 10 and status.records == 21  # one row per step and rank
    assert status.steps_per_s == pytest.approx(1.0, rel=0.1)
    rank1 = handle.metric_frames.columns(("step", "time"))[1]
    assert step_rate({1: rank1}) == pytest.approx(1.0, rel=0.1)  # its last row has no time: the rate still is



def test_the_end_table_shows_the_reports_steady_step_time_and_the_throughput_that_follows_from_it():
    """The per-rank end table and the report below it read the same steps the same way: the step time
    and samples/s are the per-rank medians over the steady steps (a 0.144 s warm-up first step left
    out), so 64 samples a step over the table's step time is the table's samples/s; the means said
    0.0204 s and 4,784 samples/s, which neither the report nor each other agreed with."""
    from workbench.cli.printing import per_rank_table, table_for_people
    from workbench.results.analysis import step_breakdown

    steady = [0.020, 0.018, 0.025, 0.019, 0.021, 0.030, 0.017, 0.016, 0.022, 0.024, 0.019]
    rows = []
    for rank in (0, 1):
        times = [0.144, 0.030, 0.012, 0.026, 0.011, *(t + 0.002 * rank for t in steady)]
        for step, step_time in enumerate(times, start=1):
            rows.append({"rank": rank, "step": step, "loss": 1.0 / step + rank, "step_time_s": step_time,
                         "samples_per_s": 64 / step_time, "mem_mb": 100.0 + step + rank})
        rows.append({"rank": rank, "step": len(times), "lr": 0.1})  # a second record at the last step
    frame = pd.DataFrame(rows)
    table = per_rank_table(frame)
    report = step_breakdown(frame).set_index("rank")
    assert list(table.columns) == ["step", "final_loss", "step_time_s", "samples_per_s", "mem_mb"]
    assert table["step_time_s"].tolist() == pytest.approx([0.020, 0.022])
    assert table["step_time_s"].tolist() == pytest.approx(report["step_time_s"].tolist())
    assert table["samples_per_s"].tolist() == pytest.approx(report["samples_per_s"].tolist())
    assert (64 / table["step_time_s"]).tolist() == pytest.approx(table["samples_per_s"].tolist())
    assert table["step"].tolist() == [16, 16] and table["mem_mb"].tolist() == [116.0, 117.0]
    assert table["final_loss"].tolist() == pytest.approx([1 / 16, 1 + 1 / 16])
    assert "3,200" in table_for_people(table)  # rank 0: 64 samples / 0.020 s


def test_after_a_continue_at_one_rank_the_report_judges_the_steps_of_that_shape_only(tmp_path):
    """2 ranks trained to step 49 (rank 1 last logged then), then the run went on at 1 rank from step 40's
    checkpoint with the effective batch kept (2 micro-batches a step: twice the work).  Rank 1's old
    rows and rank 0's own 2-rank steps are not this shape's: the report said "throughput ... over 2
    rank(s)" and "rank 0 2250% slower" (a user trial)."""
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8}, "dist": {"procs_per_node": 1},
                               "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "resized").prepare(cfg, "local")
    t0 = time.time() - 1000
    events = JsonlWriter(run.events(0))
    for rank in (0, 1):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, 50):
            writer.write({"rank": rank, "step": step, "time": t0 + step, "loss": 1.0, "step_time_s": 0.01,
                          "comm_wait_s": 0.001, "data_time_s": 0.0, "samples_per_s": 1600.0})
        writer.close()
    events.write({"event": "start", "rank": 0, "step": 0, "time": t0, "world_size": 2, "effective_batch": 16})
    t1 = t0 + 100
    events.write({"event": "start", "rank": 0, "step": 40, "time": t1, "world_size": 1, "effective_batch": 16})
    events.close()
    writer = JsonlWriter(run.metrics(0))
    for step in range(41, 81):
        writer.write({"rank": 0, "step": step, "time": t1 + step, "loss": 1.0, "step_time_s": 0.02,
                      "comm_wait_s": 0.0, "data_time_s": 0.0, "samples_per_s": 800.0})
    writer.close()
    found = Run.load(run.root).report()
    assert found["breakdown"]["rank"].tolist() == [0]
    assert found["breakdown"]["step_time_s"].tolist() == pytest.approx([0.02])
    assert len(found["stragglers"]) == 0


def test_samples_seen_count_each_stretch_at_its_own_effective_batch(tmp_path):
    """40 steps at 32 samples a step, then a continue from step 40's checkpoint at 20 a step: step 40 has
    seen 1,280 and step 200 4,480 (a user trial read 800 and 4,000: every step at the latest batch)."""
    from workbench.results.series import MetricData, samples_seen

    assert samples_seen([1, 40, 41, 200], [(0, 32), (40, 20)]).tolist() == [32, 1280, 1300, 4480]
    assert samples_seen([10], [(0, 8)]).tolist() == [80]
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 20}, "dist": {"procs_per_node": 1},
                               "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "resized").prepare(cfg, "local")
    t0 = time.time() - 1000
    events = JsonlWriter(run.events(0))
    events.write({"event": "start", "rank": 0, "step": 0, "time": t0, "world_size": 2, "effective_batch": 32})
    events.write({"event": "start", "rank": 0, "step": 40, "time": t0 + 100, "world_size": 1, "effective_batch": 20})
    events.close()
    writer = JsonlWriter(run.metrics(0))
    for step in range(1, 81):
        writer.write({"rank": 0, "step": step, "time": t0 + step + (100 if step > 40 else 0), "loss": 1.0})
    writer.close()
    loaded = Run.load(run.root)
    samples = loaded.metrics().set_index("step")["samples"]
    assert (samples[40], samples[41], samples[80]) == (1280, 1300, 2080)
    assert MetricData.from_run(loaded).x(0, "samples")[[39, 79]].tolist() == [1280, 2080]  # the plots' x axis
