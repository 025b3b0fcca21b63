"""Unit tests of workbench.results.analysis on hand-built metrics frames (no processes)."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from workbench.config import JobConfig
from workbench.config.scaling import scaling_table
from workbench.launch.scaling_bench import compare, guide_speedup
from workbench.results import analysis

pytestmark = pytest.mark.timeout(30)


def _frame(own_s: list[float], comm_s: float | None = 0.0, data_s: float = 0.01, steps: int = 20,
           mem_mb: list[float] | None = None, batch: int = 32) -> pd.DataFrame:
    """Per-rank steps where rank r works own_s[r] (data + compute) and waits comm_s plus, like in
    DDP, for the slowest rank: every rank's step time comes out the same."""
    slowest = max(own_s)
    rows = []
    for rank, own in enumerate(own_s):
        for step in range(1, steps + 1):
            wait = (comm_s or 0.0) + slowest - own
            step_time = slowest + (comm_s or 0.0) + (0.5 if step == 1 else 0.0)  # a slow first step
            row = {"rank": rank, "step": step, "epoch": 0, "time": float(step), "loss": 1.0, "lr": 1e-3,
                   "step_time_s": step_time, "data_time_s": data_s, "samples_per_s": batch / step_time,
                   "mem_mb": (mem_mb or [100.0] * len(own_s))[rank] * step / steps, "attempt": 0}
            if comm_s is not None:
                row.update(comm_wait_s=wait, comm_busy_s=wait + 0.01)
            rows.append(row)
    return pd.DataFrame(rows)


def test_breakdown_parts_add_up_to_the_step_time():
    b = analysis.step_breakdown(_frame([0.1, 0.1], comm_s=0.02))
    assert list(b["rank"]) == [0, 1] and list(b["steps"]) == [15, 15]  # first 5 steps left out
    total = b["data_time_s"] + b["compute_s"] + b["comm_wait_s"]
    assert total.tolist() == pytest.approx(b["step_time_s"].tolist())
    assert b["step_time_s"].tolist() == pytest.approx([0.12, 0.12])  # the slow first step is skipped
    assert b["compute_s"].tolist() == pytest.approx([0.09, 0.09])
    assert b["comm_share"].tolist() == pytest.approx([0.02 / 0.12] * 2)
    assert b["samples_per_s"].tolist() == pytest.approx([32 / 0.12] * 2)


def test_missing_comm_columns_give_nan_not_an_error():
    frame = _frame([0.1, 0.1], comm_s=None).drop(columns=["data_time_s"])
    b = analysis.step_breakdown(frame)
    assert b["comm_wait_s"].isna().all() and b["comm_share"].isna().all() and b["data_time_s"].isna().all()
    assert b["compute_s"].tolist() == pytest.approx(b["step_time_s"].tolist())
    rep = analysis.report(frame, JobConfig())
    assert math.isnan(rep["comm_share"]) and rep["advice"] == []
    assert "communication: not measured" in analysis.format_report(rep)


def test_empty_frame_gives_an_empty_report():
    rep = analysis.report(pd.DataFrame(), JobConfig())
    assert len(rep["breakdown"]) == 0 and len(rep["stragglers"]) == 0 and rep["advice"] == []
    assert analysis.format_report(rep) == "step analysis: no metrics logged yet"


@pytest.mark.parametrize("comm", [0.0, None])
def test_straggler_flagged_at_30_percent_not_at_5(comm):
    slow = analysis.stragglers(_frame([0.10, 0.13], comm_s=comm), threshold=0.15)
    basis = "step time" if comm is None else "data + compute"
    if comm is None:  # step times are equal under DDP: without comm_wait_s nothing shows
        assert len(slow) == 0
        slow = analysis.stragglers(_frame([0.10, 0.13], comm_s=None).assign(
            step_time_s=lambda f: f["rank"].map({0: 0.10, 1: 0.13})), threshold=0.15)
    assert slow["rank"].tolist() == [1] and slow["basis"].tolist() == [basis]
    assert slow["slower_by"].iloc[0] == pytest.approx(0.30)
    assert len(analysis.stragglers(_frame([0.10, 0.105], comm_s=comm), threshold=0.15)) == 0


def test_a_ranks_own_work_is_the_median_of_its_steps_work_not_its_median_step_less_its_median_wait():
    """Jittery steps (a loaded machine): both ranks work 2 ms in most steps and the step times are the
    same on both, as DDP's all-reduce makes them.  Rank 0's median step (11 ms) less its median wait
    (6 ms) is 5 ms, which flagged it 150% slower (seen in notebook 01's run: 4.0 ms against 1.9); the
    median of its steps' own work is 2 ms, as its live check keeps it."""
    ms = 1e-3
    steps = [11, 14, 11, 8, 7]
    own = {0: [2, 8, 2, 8, 1], 1: [2, 2, 2, 2, 2]}
    frame = pd.DataFrame([{"rank": rank, "step": i + 1, "step_time_s": steps[i] * ms,
                           "comm_wait_s": (steps[i] - work[i]) * ms, "data_time_s": 0.0}
                          for rank, work in own.items() for i in range(len(steps))])
    assert len(analysis.stragglers(frame, threshold=0.2, skip_steps=0)) == 0
    slowed = frame.assign(comm_wait_s=lambda f: f["comm_wait_s"] - (f["rank"] == 0) * 1 * ms)  # rank 0: 3 ms
    slow = analysis.stragglers(slowed, threshold=0.2, skip_steps=0)
    assert slow["rank"].tolist() == [0] and slow["own_time_s"].iloc[0] == pytest.approx(3 * ms)
    assert slow["slower_by"].iloc[0] == pytest.approx(0.5)


def test_straggler_among_four_ranks_is_compared_with_the_others():
    slow = analysis.stragglers(_frame([0.10, 0.10, 0.10, 0.13], comm_s=0.01), threshold=0.15)
    assert slow["rank"].tolist() == [3] and slow["others_median_s"].iloc[0] == pytest.approx(0.10)
    assert slow["step_share"].iloc[0] == pytest.approx(0.03 / 0.14)  # 30 ms extra in a 140 ms step
    text = analysis.format_report(analysis.report(_frame([0.10, 0.10, 0.10, 0.13], comm_s=0.01), JobConfig()))
    assert "stragglers: rank 3 30% slower" in text


def test_memory_imbalance_ratio():
    mem = analysis.memory_imbalance(_frame([0.1, 0.1, 0.1], mem_mb=[300.0, 200.0, 240.0]))
    assert mem["per_rank_mb"] == {0: 300.0, 1: 200.0, 2: 240.0}
    assert mem["ratio"] == pytest.approx(1.5) and mem["max_rank"] == 0 and mem["min_rank"] == 1
    assert "max/min 1.50 - imbalanced" in analysis.format_report(
        analysis.report(_frame([0.1, 0.1, 0.1], mem_mb=[300.0, 200.0, 240.0]), JobConfig()))
    assert math.isnan(analysis.memory_imbalance(_frame([0.1]).drop(columns=["mem_mb"]))["ratio"])


def test_advice_with_numbers_when_communication_is_40_percent():
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 32, "grad_accum_steps": 1}})
    frame = _frame([0.06, 0.06], comm_s=0.04, data_s=0.0)  # step 0.10 s: 0.06 work, 0.04 all-reduce wait
    assert analysis.communication_share(analysis.step_breakdown(frame)) == pytest.approx(0.40)
    advice = analysis.communication_advice(frame, cfg)
    assert len(advice) == 3
    gain = 1 / (0.6 + 0.4 / 2)  # Amdahl: work doubles per step, comm stays -> 1.25x
    assert all(f"{gain:.2f}x" in a for a in advice)
    assert "grad_accum_steps (1 -> 2)" in advice[0] and "640 -> 800 samples/s" in advice[0]
    assert "effective batch grows 64 -> 128" in advice[0]
    assert "micro_batch_size (32 -> 64)" in advice[1] and "MiB per rank" in advice[1]
    assert "comm_hook: fp16" in advice[2]
    compressed = analysis.communication_advice(frame, cfg.replace(dist__comm_hook="fp16"))
    assert len(compressed) == 2  # already compressed: not suggested again
    assert "40.0% of the step waits" in analysis.format_report(analysis.report(frame, cfg))


def test_the_advice_says_what_a_bigger_batch_does_to_lr_as_the_scaling_rule_computes_it():
    """lr scales with the effective batch over train.lr_ref_batch (issue 31); the advice said it follows the
    world size, not accumulation.  Unset, the reference is micro x accum x lr_ref_world_size, so doubling either
    doubles it too and lr stays: the advice says so and how to keep the reference instead."""
    from workbench import scaling_table

    frame = _frame([0.06, 0.06], comm_s=0.04, data_s=0.0)
    unset = JobConfig.from_dict({"train": {"micro_batch_size": 32, "lr": 0.1}, "scaling": {"rule": "linear"},
                                 "dist": {"procs_per_node": 2}})
    advice = analysis.communication_advice(frame, unset)
    assert all("lr stays" in a and "set train.lr_ref_batch: 32 to have scaling.rule linear scale it" in a
               for a in advice[:2]), advice
    doubled = unset.replace(train__grad_accum_steps=2)
    lr = [float(scaling_table(c, [2]).iloc[0]["lr"]) for c in (unset, doubled)]
    assert lr == [pytest.approx(0.2), pytest.approx(0.2)]  # as said: the rule leaves it
    kept = unset.replace(train__lr_ref_batch=32)
    assert "scaling.rule linear moves lr with it (from train.lr_ref_batch 32)" in analysis.communication_advice(
        frame, kept)[0]
    assert float(scaling_table(kept.replace(train__grad_accum_steps=2), [2]).iloc[0]["lr"]) == pytest.approx(0.4)
    assert "retune train.lr (scaling.rule is none)" in analysis.communication_advice(
        frame, unset.replace(scaling__rule="none"))[0]


def test_no_advice_when_communication_is_2_percent():
    frame = _frame([0.098, 0.098], comm_s=0.002, data_s=0.0)
    assert analysis.communication_advice(frame, JobConfig()) == []
    text = analysis.format_report(analysis.report(frame, JobConfig()))
    assert "2.0% of the step waits on the gradient all-reduce, below the guides' 10%" in text
    assert "what would help" not in text


def test_communication_share_is_the_least_waiting_rank():
    # rank 0 is 30% faster and waits for rank 1 inside the all-reduce: that is not communication cost
    b = analysis.step_breakdown(_frame([0.07, 0.10], comm_s=0.005, data_s=0.0))
    assert analysis.communication_share(b) == pytest.approx(0.005 / 0.105)


def test_data_wait_advice():
    advice = analysis.report(_frame([0.1, 0.1], data_s=0.04), JobConfig())["advice"]
    assert len(advice) == 1 and "data.num_workers (now 0)" in advice[0] and "1.67x" in advice[0]


def test_amdahl_gain():
    assert analysis.amdahl_gain(0.0) == 1.0
    assert analysis.amdahl_gain(0.4, 2) == pytest.approx(1.25)
    assert analysis.amdahl_gain(0.5, math.inf) == pytest.approx(2.0)


def test_report_counts_the_engine_checks_findings():
    from workbench.runfolder.events import EventSummary

    events = [{"event": "straggler", "rank": 0, "straggler_rank": 1}, {"event": "start", "rank": 0},
              {"event": "straggler", "rank": 0, "straggler_rank": 1},
              {"event": "sync_check", "rank": 0, "in_sync": True},
              {"event": "sync_check", "rank": 0, "in_sync": False}]
    checks = EventSummary().fold(events).check_counts()
    rep = analysis.report(_frame([0.1, 0.1]), JobConfig(), checks=checks)
    assert rep["events"] == {"straggler warnings": 2, "sync checks out of sync": 1}
    assert "the ranks' live checks saw: 2 straggler warnings" in analysis.format_report(rep)
    only_in_sync = EventSummary().fold(events[3:4]).check_counts()
    assert analysis.report(_frame([0.1, 0.1]), JobConfig(), checks=only_in_sync)["events"] == {}


def test_guide_speedup_and_compare():
    assert guide_speedup(1) == (1.0, 1.0) and guide_speedup(2) == (1.8, 1.8) and guide_speedup(8) == (5.5, 6.4)
    low, high = guide_speedup(6)
    assert 3.4 < low < high < 5.5 and guide_speedup(16)[0] > 8
    rows = [{"world_size": n, "samples_per_s": s} for n, s in ((4, 300.0), (2, 180.0))]
    rows = [{**r, **{c: 0.0 for c in ("nodes", "procs_per_node", "effective_batch", "step_time_s", "data_time_s",
                                      "compute_s", "comm_wait_s", "comm_share", "mem_mb_per_rank",
                                      "mem_imbalance", "steps", "run_dir")}} for r in rows]
    frame = compare(rows)
    assert frame["world_size"].tolist() == [2, 4]
    assert frame["speedup"].tolist() == pytest.approx([1.0, 300 / 180])
    assert frame["efficiency"].tolist() == pytest.approx([1.0, 300 / 180 / 2])
    assert frame["expected_speedup"].tolist() == pytest.approx([1.0, 3.3 / 1.8])  # rebased to 2 ranks


def test_scaling_table_merges_measured_columns():
    measured = pd.DataFrame({"world_size": [1, 2], "samples_per_s": [100.0, 180.0], "speedup": [1.0, 1.8],
                             "efficiency": [1.0, 0.9], "expected_speedup": [1.0, 1.8], "run_dir": ["a", "b"]})
    table = scaling_table(JobConfig(), (1, 2, 4), measured=measured)
    assert table["speedup"].tolist()[:2] == [1.0, 1.8] and math.isnan(table["speedup"].iloc[2])
    assert "run_dir" not in table and re.search("efficiency", " ".join(table.columns))
    assert list(scaling_table(JobConfig(), (1, 2)).columns) == list(table.columns[:-4])
