"""run.plan(): the plan checked against every run, on real runs through the default path (workbench.submit
with a factory): each rank's peak over its first two steps (torch's MemTracker on the real tensors under
ddp, FSDPMemTracker under fsdp2), its median step time, the plan's prediction kept in the run folder, and
where the user sees it (the report, `workbench show` from another folder).  Memory is asserted within the
plan's 10% (both sides are torch's tracker; the machine's load does not move them); step times only
exist and are said, as the machine is shared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import workbench
from tests.support.lifecycle import assert_nothing_left
from tests.support.tasks_for_tests import conv_net
from workbench.config import JobConfig
from workbench.engine.builtin_tasks import synthetic_classification
from workbench.errors import ArgumentError

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]


def wide_mlp(n_train: int = 2048) -> object:
    """A factory as a notebook cell defines one: an MLP whose weights (2 MiB) and AdamW state dominate its
    step's memory, and a TensorDataset whose rows are views of one 2 MiB tensor (not the step's memory)."""
    return synthetic_classification(n_train=n_train, n_val=64, dim=256, hidden=2048, classes=16)


def _cfg(root: Path, strategy: str = "ddp", ranks: int = 2, **log) -> JobConfig:
    return JobConfig.from_dict({
        "train": {"micro_batch_size": 16, "max_steps": 30},
        "dist": {"procs_per_node": ranks, "strategy": strategy, "threads_per_rank": 1, "timeout_s": 60},
        "launch": {"run_root": str(root / "runs")}, "log": log})


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the link probe's cache: this test's own


def test_a_ddp_run_is_checked_against_its_plan_per_rank_and_the_user_sees_it(tmp_path):
    run = workbench.submit(_cfg(tmp_path), task=wide_mlp)
    assert run.wait(timeout=240).state == "finished", run.exception()
    memory = run.event_summary().memory
    assert sorted(memory) == [0, 1] and {e["how"] for e in memory.values()} == {"MemTracker"}
    assert all(e["steps"] == [1, 2] for e in memory.values())

    # before any prediction: the report says the measured peak and how to get the plan
    said = "\n".join(run.report()["plan"])
    assert "peak memory a rank over its first two steps: " in said and "run.plan()" in said

    check = run.plan()
    assert list(check["rank"]) == [0, 1]
    assert (check["peak_error"].abs() <= 0.10).all(), check  # the same tracker, fake vs real tensors
    assert (check["predicted_peak_mb"] > 12).all(), "weights, gradients and AdamW's two moments of 2.1 MiB"
    assert (check["measured_step_s"] > 0).all() and (check["predicted_step_s"] > 0).all(), check.attrs["notes"]
    assert not [m for m in check.attrs["misses"] if "peak memory" in m], check.attrs["misses"]
    assert any("measured with 2 ranks stepping at once" in n for n in check.attrs["notes"]), check.attrs["notes"]
    kept = run.dir.plan
    assert kept.is_file()
    stamp = kept.stat().st_mtime_ns
    again = workbench.Run.load(run.folder).plan()  # a new handle: read back, not computed again
    assert kept.stat().st_mtime_ns == stamp and again["predicted_step_s"].tolist() == check["predicted_step_s"].tolist()

    # where the user sees it: the report, and `workbench show` from another folder
    lines = run.report()["plan"]
    assert lines[0].startswith("plan vs measured") and any("predicted" in line for line in lines), lines
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = subprocess.run([sys.executable, "-m", "workbench.cli", "show", str(run.folder)], cwd=elsewhere,
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "plan vs measured" in shown.stdout and "MiB measured" in shown.stdout, shown.stdout[-3000:]
    assert_nothing_left(run.folder)


def test_an_fsdp2_run_measures_its_sharded_peak_with_fsdpmemtracker(tmp_path):
    run = workbench.submit(_cfg(tmp_path, "fsdp2"), task=wide_mlp)
    assert run.wait(timeout=240).state == "finished", run.exception()
    assert {e["how"] for e in run.event_summary().memory.values()} == {"FSDPMemTracker"}
    check = run.plan(probe=False)  # memory only: no step probe
    assert (check["peak_error"].abs() <= 0.10).all(), check
    assert check["predicted_step_s"].isna().all()
    ddp_alone = synthetic_classification(n_train=64, dim=256, hidden=2048, classes=16)
    whole = sum(p.numel() * 4 for p in ddp_alone.model.parameters()) / 2**20
    assert (check["measured_peak_mb"] < 4 * whole).all(), "sharded: less than ddp's weights, grads and 2 moments"
    assert_nothing_left(run.folder)


@pytest.mark.parametrize("strategy,factory", [("fsdp2", wide_mlp), ("ddp", conv_net)], ids=["fsdp2", "ddp"])
def test_gradient_accumulation_is_measured_trains_and_meets_its_plan(tmp_path, strategy, factory):
    """torch's FSDPMemTracker raises on a unit's forward after its backward within what it tracks: the
    next micro-batch of gradient accumulation.  In a rank that failed the run at step 1 (NotImplementedError,
    "multiple iterative calls"); the probe lets the unit run again and the run trains.  The plan holds the
    accumulated gradients too: fsdp2 keeps every unit's gradient whole until the step's last micro-batch
    (measured 9.60 MiB a rank where the plan said 8.66 before it counted them), and DDP its buckets beside
    the gradients no_sync()'s micro-batches make (the conv net: 29.9 MiB measured, 25.9 planned before)."""
    cfg = _cfg(tmp_path, strategy).replace(train__grad_accum_steps=2, train__max_steps=4)
    run = workbench.submit(cfg, task=factory)
    assert run.wait(timeout=240).state == "finished", run.exception()
    memory = run.event_summary().memory
    how = "FSDPMemTracker" if strategy == "fsdp2" else "MemTracker"
    assert sorted(memory) == [0, 1] and all(e["how"] == how and e["peak_mb"] > 0 for e in memory.values()), memory
    check = run.plan(probe=False)
    assert (check["peak_error"].abs() <= 0.10).all(), check
    assert not [m for m in check.attrs["misses"] if "peak memory" in m], check.attrs["misses"]
    assert_nothing_left(run.folder)


def test_measuring_memory_can_be_turned_off_and_a_script_run_has_no_plan(tmp_path):
    run = workbench.submit(_cfg(tmp_path, ranks=1, measure_memory=False), task=wide_mlp)
    assert run.wait(timeout=240).state == "finished", run.exception()
    assert run.event_summary().memory == {}
    assert run.report()["plan"] == []  # nothing measured, nothing predicted: the report says nothing of it

    script = tmp_path / "train.py"
    script.write_text("print('trained', flush=True)\n")
    own = workbench.submit_script(script, nproc=1, cfg=_cfg(tmp_path, ranks=1))
    assert own.wait(timeout=120).state == "finished", own.exception()
    with pytest.raises(ArgumentError, match=r"ran your own script; the plan models the engine's training step"):
        own.plan()
    assert own.report()["plan"] == []
    assert_nothing_left(own.folder)

    yours = workbench.submit_fn(abs, -3, cfg=_cfg(tmp_path, ranks=1))  # a function of the user's own
    assert yours.wait(timeout=120).state == "finished", yours.exception()
    with pytest.raises(ArgumentError, match=r"ran your own function; the plan models the engine's training step"):
        yours.plan()
    assert yours.report()["plan"] == []
    assert_nothing_left(yours.folder)
