"""Cost of the default observability: comm timing hook, sync/straggler checks, heartbeat thread.

Runs the same 2-rank CPU job with the defaults and with everything that can be switched off
switched off (dist.measure_comm false, dist.check_every_steps empty), alternately, and compares
the median wall time of a step.  The heartbeat thread (one small file write every 2 s) cannot be
switched off; its cost is inside both figures and is also timed alone.

    python bench/observability_overhead.py [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import workbench
from workbench.config import JobConfig
from workbench.engine.monitor import RankMonitor
from workbench.runfolder.layout import RunDir

TASK = {"n_train": 65536, "n_val": 64, "dim": 256, "hidden": 1024, "classes": 16}
WARMUP = 30


def median_step_s(root: str, steps: int, observe: bool) -> tuple[float, float]:
    cfg = JobConfig.from_dict({
        "task": {"name": "synthetic", "options": TASK},
        "train": {"micro_batch_size": 64, "max_steps": steps, "checkpoint_every_steps": 100000},
        "dist": {"procs_per_node": 2, "measure_comm": observe, "check_every_steps": 100 if observe else None},
        "launch": {"run_root": root, "time_limit": "20"},
    })
    run = workbench.submit(cfg)
    run.wait(timeout=600)
    frame = run.metrics()
    times = frame[(frame["rank"] == 0) & (frame["step"] >= WARMUP)].sort_values("step")["time"]
    events = run.events()
    checks = events[events["event"] == "sync_check"]["check_s"] if observe else []
    return statistics.median(times.diff().dropna()), (statistics.median(checks) if len(checks) else 0.0)


def heartbeat_cost_s(beats: int = 200) -> float:
    with tempfile.TemporaryDirectory() as root:
        monitor = RankMonitor(RunDir(Path(root)).create(), 0, 2)
        start = time.perf_counter()
        for _ in range(beats):
            monitor._watch_progress()
            monitor.write_status()
        return (time.perf_counter() - start) / beats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    ratios, check_shares = [], []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.rounds):
            (off, _), (on, check_s) = median_step_s(root, args.steps, False), median_step_s(root, args.steps, True)
            ratios.append(on / off)
            check_shares.append(check_s / (100 * on))
            print(f"round {i + 1}: step {off * 1e3:.2f} ms without, {on * 1e3:.2f} ms with observability "
                  f"(x{on / off:.3f})", flush=True)
    beat = heartbeat_cost_s()
    print(f"median overhead of default observability: {100 * (statistics.median(ratios) - 1):+.2f}% of step time "
          f"(target < 1%)")
    print(f"sync/straggler check: {100 * statistics.median(check_shares):.3f}% of step time "
          "(one check every 100 steps, timed inside the run)")
    print(f"heartbeat: {beat * 1e6:.0f} us per beat every 2 s = {100 * beat / 2:.4f}% of one core")


if __name__ == "__main__":
    main()
