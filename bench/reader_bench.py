"""Reader benchmark: a cold `Run.load(folder).metrics()` against polars' read_ndjson of the same files,
and `workbench.runs()` over many run folders.

    python bench/reader_bench.py [--ranks 64] [--points 20000] [--rounds 5] [--folders 500] [--cold]

(a) A run folder of `ranks` x `points` metric records as the engine writes them (its record,
    `json.dumps` one line each) is written once into $TMPDIR/workbench-reader-bench/ and reused.
    Each round, alternating, times:
      - workbench: `Run.load(folder).metrics()` in a fresh handle (every file read, folded, the
        frame with wall_time, elapsed_s and samples), the columnar path on;
      - polars: `pl.read_ndjson(file)` for every rank file, concatenated (the files' bytes are in the
        page cache for both: "cold" means a fresh handle, not a cold disk);
      - pyarrow: `pyarrow.json.read_json` of every file (only to show why polars was chosen);
      - workbench, NaN: `metrics()` of a second folder where comm timing was off (the engine logs
        NaN for comm_wait_s and comm_busy_s: not JSON, so polars cannot read that folder at all);
      - line by line: the same `metrics()` with the columnar path off (what a reader without polars
        gets, and what every read was before issue 17), in the first round only (it takes ~15 s).
    Target: workbench median <= 1.5x polars median.
(b) `folders` small finished run folders (2 ranks x 50 records, start and eval events, status
    files, summary), written once; `workbench.runs(root)` timed: the first call of a fresh
    interpreter (pandas imported before timing), `rounds` times, and the calls after it in this
    process.  An ended run's row is kept in its folder (row.json) the first time it is listed, with
    the sizes and times of the files it was read from, which every call checks (one listing of the
    folder and of its per-rank folders, a stat per file).  With --cold the kept rows are removed
    first and the listing that reads every folder (run.json, config.yaml, status, metrics, events)
    is timed in a fresh process, `rounds` times (--against TREE: another checkout's code too, rounds
    alternating): what a run folder costs the first time it is ever listed.  Targets: <= 1 s once
    listed; <= 5 s never listed before (issue 30 item 9).

polars is a dependency of workbench (the columnar path); pyarrow is optional here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_ROOT = Path(tempfile.gettempdir()) / "workbench-reader-bench"
RATIO_TARGET = 1.5
RUNS_TARGET_S = 1.0
COLD_TARGET_S = 5.0


# --- run folders --------------------------------------------------------------------------------
def record(rank: int, step: int, t: float, timed: bool) -> dict:
    """One metrics line as the engine writes it (workbench.engine.trainer.Trainer.record + loss_reduced)."""
    base = 0.3 + 2.2 * math.exp(-step / 4000)
    noise = 0.08 * math.sin(step * 12.9898 + rank * 78.233) * math.cos(step * 0.37)
    step_time = 0.1 + 0.01 * abs(math.sin(step * 0.61 + rank))
    lr = 1e-3 * min(1.0, step / 500) * (0.5 + 0.5 * math.cos(math.pi * min(step, 40000) / 40000))
    comm = (0.0123 * abs(math.cos(step * 0.3 + rank)), 0.0311 * abs(math.sin(step * 0.7))) if timed else (
        math.nan, math.nan)
    return {"rank": rank, "step": step, "epoch": step // 2500, "time": t, "loss": base + noise, "lr": lr,
            "step_time_s": step_time, "data_time_s": 0.0021 * (1 + math.sin(step)), "comm_wait_s": comm[0],
            "comm_busy_s": comm[1], "samples_per_s": 32 / step_time, "mem_mb": 812.0 + 3 * rank + step * 1e-4,
            "attempt": 0, "loss_reduced": base}


def big_run(ranks: int, points: int, timed: bool = True) -> Path:
    """The ranks x points run folder, written once (about 360 bytes a record); with timed=False the
    comm times are NaN, as the engine logs them with comm timing off."""
    from workbench.config import JobConfig
    from workbench.runfolder.layout import RunDir
    from workbench.runfolder.writer import JsonlWriter

    folder = BENCH_ROOT / f"run-{ranks}x{points}{'' if timed else '-nan'}"
    done = folder / "complete"
    if done.exists():
        return folder
    print(f"writing {ranks} x {points} records into {folder} (once) ...", flush=True)
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": ranks}, "launch": {"run_root": str(BENCH_ROOT)}})
    run = RunDir(folder).prepare(cfg, "local")
    t0 = time.time() - points * 0.1
    JsonlWriter(run.events(0)).write({"event": "start", "rank": 0, "step": 0, "time": t0, "total_steps": points,
                                      "world_size": ranks, "effective_batch": 32 * ranks})
    for rank in range(ranks):
        lines = (json.dumps(record(rank, step, t0 + 0.1 * step, timed), default=float) + "\n"
                 for step in range(1, points + 1))
        with open(run.metrics(rank), "w") as fh:
            fh.writelines(lines)
    done.write_text("")
    return folder


def many_runs(count: int) -> Path:
    """`count` small finished run folders under one root, written once."""
    from workbench.config import JobConfig
    from workbench.runfolder.layout import RunDir, write_json_atomic
    from workbench.runfolder.writer import JsonlWriter

    root = BENCH_ROOT / f"runs-{count}"
    if (root / "complete").exists():
        return root
    print(f"writing {count} run folders into {root} (once) ...", flush=True)
    for i in range(count):
        cfg = JobConfig.from_dict({"train": {"lr": 0.001 * (1 + i % 7)}, "dist": {"procs_per_node": 2},
                                   "launch": {"run_root": str(root), "name": f"run{i:04d}"}})
        run = RunDir(root / f"run{i:04d}").prepare(cfg, "local")
        t0 = time.time() - 1000
        events = JsonlWriter(run.events(0))
        events.write({"event": "start", "rank": 0, "step": 0, "time": t0, "total_steps": 50, "world_size": 2,
                      "effective_batch": 64, "lr": cfg.train.lr})
        for rank in range(2):
            writer = JsonlWriter(run.metrics(rank))
            for step in range(1, 51):
                writer.write(record(rank, step, t0 + step, True))
            writer.close()
            write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": 50, "time": t0 + 60})
        events.write({"event": "eval", "rank": 0, "step": 50, "time": t0 + 55, "val_loss": 0.4})
        events.close()
        write_json_atomic(run.summary, {"status": "finished", "steps": 50, "total_steps": 50, "world_size": 2})
    (root / "complete").write_text("")
    return root


# --- the contenders ------------------------------------------------------------------------------
def workbench_metrics(folder: Path) -> tuple[float, int]:
    from workbench.launch.run import Run

    start = time.perf_counter()
    frame = Run.load(folder).metrics()
    return time.perf_counter() - start, len(frame)


def line_by_line_metrics(folder: Path) -> tuple[float, int]:
    from workbench.runfolder import fastjson

    saved = fastjson.read_block
    fastjson.read_block = lambda block, max_line_bytes=0: None  # the columnar path off
    try:
        return workbench_metrics(folder)
    finally:
        fastjson.read_block = saved


def polars_read(folder: Path) -> tuple[float, int]:
    import polars as pl

    files = sorted((folder / "metrics").glob("rank*.jsonl"))
    start = time.perf_counter()
    frame = pl.concat([pl.read_ndjson(path) for path in files], how="diagonal_relaxed")
    return time.perf_counter() - start, frame.height


def pyarrow_read(folder: Path) -> tuple[float, int] | None:
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        return None
    files = sorted((folder / "metrics").glob("rank*.jsonl"))
    start = time.perf_counter()
    tables = [pj.read_json(path) for path in files]
    rows = sum(t.num_rows for t in tables)
    del pa
    return time.perf_counter() - start, rows


def runs_listing(root: Path) -> tuple[float, int]:
    import workbench

    start = time.perf_counter()
    table = workbench.runs(root)
    return time.perf_counter() - start, len(table)


FRESH_PROCESS = """
import json, sys, time
import pandas  # imported before timing, as in a notebook that has used pandas: an import is not a read
import workbench
wall, cpu = time.perf_counter(), time.process_time()
table = workbench.runs(sys.argv[1])
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu, len(table)]))
"""


def runs_in_a_fresh_process(root: Path, checkout: Path | None = None) -> tuple[float, float, int]:
    """The first `workbench.runs(root)` call of a new interpreter: (wall, CPU, rows); `checkout`:
    the workbench source tree it imports (default: this one)."""
    import subprocess

    tree = checkout or Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(root)], capture_output=True, text=True,
                         check=True, cwd=tree, env=env)
    wall, cpu, rows = json.loads(out.stdout.strip().splitlines()[-1])
    return wall, cpu, rows


# --- report --------------------------------------------------------------------------------------
def bench_reader(args: argparse.Namespace) -> bool:
    import pandas as pd
    import polars  # noqa: F401 - imported before timing: an import is not a read

    import workbench.launch.run  # noqa: F401

    pd.DataFrame({"a": ["x"]}).copy()  # pandas' own lazy imports (its text columns), as in a notebook

    folder, untimed = big_run(args.ranks, args.points), big_run(args.ranks, args.points, timed=False)
    size = sum(p.stat().st_size for p in (folder / "metrics").glob("rank*.jsonl"))
    print(f"\n(a) cold metrics(): {args.ranks} ranks x {args.points} records, {size / 1e6:.0f} MB of JSONL")
    times: dict[str, list[float]] = {}
    contenders = [("workbench metrics()", workbench_metrics), ("polars read_ndjson", polars_read),
                  ("pyarrow.json read_json", pyarrow_read),
                  ("workbench metrics(), NaN", lambda _: workbench_metrics(untimed))]
    cpu: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        order = contenders if round_ % 2 == 0 else contenders[::-1]
        if round_ == 0 and args.line_by_line:
            order = [*order, ("line by line (columnar off)", line_by_line_metrics)]
        for name, fn in order:
            started = time.process_time()
            result = fn(folder)
            if result is not None:
                times.setdefault(name, []).append(result[0])
                cpu.setdefault(name, []).append(time.process_time() - started)
                print(f"  round {round_ + 1}: {name:30s} {result[0]:7.2f} s wall {cpu[name][-1]:7.2f} s CPU  "
                      f"({result[1]:,} rows)", flush=True)
    print(f"  {'median':37s} {'wall':>7s}   {'CPU (all threads)':>7s}")
    for name in times:
        print(f"  {name:37s} {statistics.median(times[name]):7.2f} s {statistics.median(cpu[name]):7.2f} s")
    ratio = statistics.median(times["workbench metrics()"]) / statistics.median(times["polars read_ndjson"])
    cpu_ratio = statistics.median(cpu["workbench metrics()"]) / statistics.median(cpu["polars read_ndjson"])
    ratios = [w / p for w, p in zip(times["workbench metrics()"], times["polars read_ndjson"])]
    print(f"  workbench / polars: wall {ratio:.2f} (per round {[round(r, 2) for r in ratios]}), CPU {cpu_ratio:.2f} "
          f"(target <= {RATIO_TARGET}) -> {'met' if ratio <= RATIO_TARGET else 'MISSED'}")
    return ratio <= RATIO_TARGET


def bench_runs(args: argparse.Namespace) -> bool:
    import pandas  # noqa: F401 - imported before timing: an import is not a read

    root = many_runs(args.folders)
    print(f"\n(b) workbench.runs() over {args.folders} run folders")
    cold_met = True
    if args.cold:
        contenders = [("this tree", None), *(("against " + str(tree), Path(tree)) for tree in args.against)]
        cold: dict[str, list[tuple[float, float]]] = {}
        for round_ in range(args.rounds):
            for name, tree in contenders if round_ % 2 == 0 else contenders[::-1]:
                for kept in root.glob("*/row.json"):  # RunDir.row_cache: what a first read leaves
                    kept.unlink()
                wall, cpu, rows = runs_in_a_fresh_process(root, tree)
                cold.setdefault(name, []).append((wall, cpu))
                print(f"  round {round_ + 1}, never listed before, {name}: {wall:6.2f} s wall {cpu:6.2f} s CPU "
                      f"({rows} rows; load {os.getloadavg()[0]:.1f})", flush=True)
        for name, times in cold.items():
            print(f"  never listed before, {name}: median {statistics.median(w for w, _ in times):.2f} s wall, "
                  f"{statistics.median(c for _, c in times):.2f} s CPU (target <= {COLD_TARGET_S} s)")
        cold_met = statistics.median(w for w, _ in cold["this tree"]) <= COLD_TARGET_S
        print(f"  never listed before: {'met' if cold_met else 'MISSED'}")
    runs_listing(root)  # the rows are kept (once ever per run folder), by this tree's code
    fresh = [runs_in_a_fresh_process(root) for _ in range(args.rounds)]
    for i, (wall, cpu, rows) in enumerate(fresh):
        print(f"  fresh process {i + 1}: first call {wall:6.3f} s wall {cpu:6.3f} s CPU ({rows} rows)", flush=True)
    times, cpus = [], []
    for _ in range(args.rounds):
        started = time.process_time()
        seconds, rows = runs_listing(root)
        times.append(seconds)
        cpus.append(time.process_time() - started)
    first, first_cpu = statistics.median(f[0] for f in fresh), statistics.median(f[1] for f in fresh)
    median = statistics.median(times)
    print(f"  first call of a process: median {first:.3f} s wall, {first_cpu:.3f} s CPU; calls after it: median "
          f"{median:.3f} s wall, {statistics.median(cpus):.3f} s CPU (target <= {RUNS_TARGET_S} s) -> "
          f"first {'met' if first <= RUNS_TARGET_S else 'MISSED'}, "
          f"after {'met' if median <= RUNS_TARGET_S else 'MISSED'}")
    return first <= RUNS_TARGET_S and median <= RUNS_TARGET_S and cold_met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--points", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--folders", type=int, default=500)
    parser.add_argument("--no-line-by-line", dest="line_by_line", action="store_false",
                        help="skip the ~15 s line-by-line round")
    parser.add_argument("--only", choices=("reader", "runs"), help="run one part")
    parser.add_argument("--cold", action="store_true",
                        help="(b): first remove every kept row and time the listing that reads every folder "
                             "(a fresh process each round)")
    parser.add_argument("--against", action="append", default=[], metavar="TREE",
                        help="with --cold: also time another workbench source tree (e.g. a main checkout), "
                             "alternating rounds")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
          f"{os.cpu_count()} CPUs")
    met = True
    if args.only in (None, "reader"):
        met = bench_reader(args) and met
    if args.only in (None, "runs"):
        met = bench_runs(args) and met
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
