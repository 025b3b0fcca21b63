"""One state shown everywhere (progress line, rate, ETA, "starting"), the derived metric columns and
the views plots share (smoothing, median band, outliers).  Run folders are written by hand, as the
ranks write them; no rank processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.config import JobConfig
from workbench.launch.run import Run
from workbench.launch.status import RankStatus, RunStatus, step_rate
from workbench.rundir import RunDir, write_json_atomic
from workbench.stream import JsonlWriter

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[1]


def run_folder(tmp_path: Path, world: int = 2, steps: int = 50, **train) -> RunDir:
    cfg = JobConfig.from_dict({"train": {"micro_batch_size": 8, **train}, "dist": {"procs_per_node": world},
                               "launch": {"run_root": str(tmp_path)}})
    run = RunDir(tmp_path / "run").prepare(cfg, "local", job_id=str(os.getpid()))  # this process: "live"
    t0 = time.time() - steps * 0.1
    for rank in range(world):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, steps + 1):
            writer.write({"rank": rank, "step": step, "time": t0 + 0.1 * step, "loss": 2.0 / step + 0.01 * rank,
                          "loss_reduced": 2.0 / step, "lr": 1e-3, "step_time_s": 0.1, "mem_mb": 100.0})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "running", "step": steps, "time": time.time()})
    return run


def test_one_progress_line_for_dashboard_show_and_run(tmp_path, capsys):
    from workbench.cli import main
    from workbench.ui.dashboard import progress_text
    from workbench.ui.state import read_state

    run = run_folder(tmp_path)
    JsonlWriter(run.events(0)).write({"event": "start", "rank": 0, "time": time.time(), "total_steps": 200,
                                      "effective_batch": 16})
    handle = Run.load(run.root)
    status = handle.status()
    line = status.progress_line()
    assert line.startswith("running · step 50/200 (25%) · 10 steps/s · ETA 0:00:15"), line
    state = read_state(handle, max_points=100)
    assert state.line == line
    assert "running</b> · step 50/200 (25%) · 10 steps/s · ETA 0:00:15" in progress_text(state)
    main(["show", str(run.root)])
    assert line in capsys.readouterr().out


def test_rate_is_steady_with_one_late_rank_and_bursty_writes():
    base = pd.DataFrame({"step": range(10, 2010, 10), "time": [100.0 + i for i in range(200)]})
    frames = {0: base, 1: base.assign(time=base["time"] + 0.3), 2: base.iloc[:-3]}  # rank 2 a bit behind
    assert step_rate(frames) == pytest.approx(10.0)
    # records written in bursts (two at once every 2 s): the window keeps the rate at 10 steps/s
    bursty = base.assign(time=[100.0 + 2 * (i // 2) for i in range(200)])
    rates = [step_rate({0: bursty.iloc[:n]}) for n in range(20, 200)]
    assert min(rates) > 8.5 and max(rates) < 11.5, (min(rates), max(rates))


def test_eta_is_unknown_before_a_rate_and_zero_when_done():
    ranks = [RankStatus(0, "starting")]
    assert RunStatus("running", ranks, 0, 100).progress_line() == "running · step 0/100 (0%) · ETA unknown"
    assert RunStatus("finished", ranks, 80, 100, steps_per_s=3.0).progress_line() == \
        "finished · step 80/100 (100%) · 3 steps/s"


def test_a_rank_says_starting_before_torch_is_imported(tmp_path):
    run = run_folder(tmp_path, world=2, steps=0)
    run.status(1).unlink()
    code = f"""
import sys, submitit
import workbench.engine.entry as entry
class Env:
    global_rank = 1
submitit.JobEnvironment = Env
entry._announce({str(run.root)!r})
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # it said so before the slow import
    status = json.loads(run.status(1).read_text())
    assert status["state"] == "starting" and status["rank"] == 1
    assert Run.load(run.root).status().ranks[1].state == "starting"


def test_metrics_give_wall_time_elapsed_and_samples_and_keep_time(tmp_path):
    run = run_folder(tmp_path, world=2, steps=20, grad_accum_steps=3)
    frame = Run(run.root).metrics()
    assert {"time", "wall_time", "elapsed_s", "samples"} <= set(frame.columns)
    assert frame["time"].dtype == float  # Unix seconds, as before
    assert str(frame["wall_time"].dtype).startswith("datetime64") and str(frame["wall_time"].dt.tz) == "UTC"
    assert (frame["wall_time"].astype("int64") // 10**9 == frame["time"].astype("int64")).all()
    created = json.loads(run.meta.read_text())["created"]  # the run folder's birth
    assert np.allclose(frame["elapsed_s"], frame["time"] - created)
    assert frame.loc[frame["step"] == 10, "samples"].tolist() == [10 * 8 * 3 * 2] * 2


def test_ema_band_and_outliers():
    from workbench.metricview import band, ema

    values = np.array([1.0, 3.0, np.nan, 3.0])
    smoothed = ema(values, 0.5)
    assert smoothed[0] == 1.0 and np.isfinite(smoothed).all() and smoothed[-1] < 3.0
    assert (ema(values, 0.0)[[0, 1, 3]] == values[[0, 1, 3]]).all()
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"rank": np.repeat(range(16), 100), "step": np.tile(range(100), 16),
                          "loss": rng.random(1600)})
    frame.loc[frame["rank"] == 11, "loss"] += 3.0
    found = band(frame, "loss")
    assert found.outliers == [11] and len(found.x) == 100
    assert (found.low <= found.median).all() and (found.median <= found.high).all()
