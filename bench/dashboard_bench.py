"""Dashboard benchmark: kernel-side cost of a refresh, and write-to-screen latency.

    python bench/dashboard_bench.py [--ranks 64] [--points 20000] [--records 60]

    python bench/dashboard_bench.py --ranks 64,8 --points 20000     # both budgets, one after the other

(a) A run folder with `ranks` x `points` realistic metric records (written with the engine's own
    JsonlWriter into the RunDir layout, plus status files and a start event), a Dashboard with
    autostart=False, and timed `refresh()` calls: the first one (reads every file, first draw),
    then incremental ones (10 new records per rank before each, as a 1 s poll of a 10 steps/s run
    would see), idle ones (nothing new), and ones after a loss spike that forces the axes to be
    redrawn with new limits.  The figure is the dashboard's own ipympl canvas, as with a browser
    attached (it then sends only changed pixels and stops re-encoding a data URL: set here too).
    Every record is drawn (M4 per pixel column, smoothing on the full series): nothing is thinned.
    Wall time and this process's CPU time are reported: on a shared machine the CPU time is the
    steadier figure.  Targets: first refresh <= 3 s at 64 x 20,000; incremental <= 150 ms at 64
    ranks and <= 100 ms at 8.
(b) A writer process appends one record per rank every ~100 ms, stamped with its write time; the
    dashboard's own poller (default poll_s) picks them up.  Latency = when the refresh that shows
    a record has set the widgets - its write time.  Target: p95 under 1.5 s.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from workbench.config import JobConfig
from workbench.launch.run import Run
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.writer import JsonlWriter

REFRESH_TARGET_MS = {64: 150.0, 8: 100.0}
"""Incremental refresh budget by world size (the nearest listed size at or above a run's applies)."""
FIRST_TARGET_S = 3.0
"""The first refresh of a 64 x 20,000 run."""
LATENCY_P95_TARGET_S = 1.5


def refresh_target(ranks: int) -> float:
    return min((ms for n, ms in REFRESH_TARGET_MS.items() if n >= ranks), default=REFRESH_TARGET_MS[64])


# --- a realistic run folder ------------------------------------------------------------------------
def record(rank: int, step: int, t: float, ranks: int) -> dict:
    """One metrics line as the engine writes it: decaying noisy loss, warmup+cosine lr, jittery timing."""
    base = 0.3 + 2.2 * math.exp(-step / 4000)
    noise = 0.08 * math.sin(step * 12.9898 + rank * 78.233) * math.cos(step * 0.37)
    step_time = 0.1 + 0.01 * abs(math.sin(step * 0.61 + rank))
    lr = 1e-3 * min(1.0, step / 500) * (0.5 + 0.5 * math.cos(math.pi * min(step, 40000) / 40000))
    return {"rank": rank, "step": step, "epoch": step // 2500, "time": t, "loss": base + noise,
            "loss_reduced": base, "lr": lr, "step_time_s": step_time, "data_time_s": 0.002,
            "samples_per_s": 32 / step_time, "mem_mb": 812.0 + 3 * rank + step * 1e-4, "attempt": 0}


def make_run(root: Path, ranks: int, points: int) -> Run:
    """A live-looking run: its 'job' is this process (Run.load reattaches to it), ranks running."""
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": ranks}, "launch": {"run_root": str(root)}})
    run_dir = RunDir(root / "bench-run").prepare(cfg, "local", job_id=str(os.getpid()))
    t0 = time.time() - points * 0.1
    JsonlWriter(run_dir.events(0)).write({"event": "start", "rank": 0, "step": 0, "time": t0,
                                          "total_steps": 2 * points, "world_size": ranks})
    for rank in range(ranks):
        writer = JsonlWriter(run_dir.metrics(rank))
        for step in range(1, points + 1):
            writer.write(record(rank, step, t0 + step * 0.1, ranks))
        writer.close()
    for rank in range(ranks):  # heartbeats as of now (the ranks beat every 2 s; writing took a while)
        write_status(run_dir, rank, points)
    return Run.load(run_dir.root)


def write_status(run_dir: RunDir, rank: int, step: int) -> None:
    write_json_atomic(run_dir.status(rank), {"rank": rank, "state": "running", "step": step, "time": time.time(),
                                             "pid": os.getpid(), "host": "bench", "attempt": 0})


def append(run: Run, ranks: int, first_step: int, count: int, spike: float = 0.0) -> int:
    for rank in range(ranks):
        writer = JsonlWriter(run.dir.metrics(rank))
        for step in range(first_step, first_step + count):
            rec = record(rank, step, time.time(), ranks)
            writer.write({**rec, "loss": rec["loss"] + spike})
        writer.close()
        write_status(run.dir, rank, first_step + count - 1)
    return first_step + count


# --- (a) refresh cost ------------------------------------------------------------------------------
def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1000


def bench_refresh(run: Run, ranks: int, points: int, repeats: int) -> list[tuple[str, list[float]]]:
    from workbench.ui import Dashboard

    dash = Dashboard(run, autostart=False, remember=False)  # the defaults a first dashboard shows
    dash.plot.live.canvas.syncing_data_url = False  # what a connected browser's "initialized" message does
    parts: dict[str, list[float]] = {"read": [], "render": []}
    _wrap(dash.plot, "show", parts["render"])
    _wrap(sys.modules["workbench.ui.dashboard"], "read_state", parts["read"])
    started = time.process_time()
    rows = [("first refresh (read all, first draw)", [timed(dash.refresh)]),
            ("  its CPU time", [(time.process_time() - started) * 1000]),
            ("  of which: poll files + state", parts["read"][:1]),
            ("  of which: figure (data, draw, blit)", parts["render"][:1])]
    step, incremental, cpu = points + 1, [], []
    for _ in range(repeats):
        step = append(run, ranks, step, 10)
        dash.plot.live.canvas.syncing_data_url = False  # a new canvas (the figure resized): its view is there too
        started = time.process_time()
        incremental.append(timed(dash.refresh))
        cpu.append((time.process_time() - started) * 1000)
    rows.append(("incremental refresh (+10 records/rank)", incremental))
    rows.append(("  of which: poll files + state", parts["read"][1:]))
    rows.append(("  of which: figure (data, draw, blit)", parts["render"][1:]))
    rows.append(("idle refresh (nothing new)", [timed(dash.refresh) for _ in range(repeats)]))
    spikes = []
    for i in range(3):  # a loss spike outside the y limits: the axes are redrawn with new limits
        step = append(run, ranks, step, 10, spike=3.0 + i)
        spikes.append(timed(dash.refresh))
    rows.append(("refresh with a full redraw (loss spike)", spikes))
    rows.append(("  CPU time of the incremental refreshes", cpu))
    print(f"  (figure: {dash.plot.live.full_draws} full draws, {dash.plot.live.line_draws} data-only redraws; "
          f"{dash.state.records} records)")
    return rows


def _wrap(target, name: str, sink: list[float]) -> None:
    """Time every call of target.name (patched where the dashboard looks it up)."""
    inner = getattr(target, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink.append((time.perf_counter() - start) * 1000)

    setattr(target, name, wrapper)


# --- (b) stream latency ----------------------------------------------------------------------------
def writer_process(folder: str, ranks: int, first_step: int, count: int, every_s: float) -> None:
    run_dir = RunDir(Path(folder))
    writers = [JsonlWriter(run_dir.metrics(rank)) for rank in range(ranks)]
    beat = 0.0
    for i in range(count):
        for rank, writer in enumerate(writers):
            writer.write(record(rank, first_step + i, time.time(), ranks))
        if time.monotonic() - beat >= 2.0:  # each rank's heartbeat (engine.monitor: every 2 s)
            beat = time.monotonic()
            for rank in range(ranks):
                write_status(run_dir, rank, first_step + i)
        time.sleep(every_s)
    for writer in writers:
        writer.close()


def bench_latency(run: Run, ranks: int, first_step: int, count: int) -> list[float]:
    from workbench.ui import Dashboard

    dash = Dashboard(run, remember=False)  # default poll_s; its own background poller
    seen, latencies = first_step - 1, []

    def on_refresh(_state) -> None:
        nonlocal seen
        now = time.time()
        frame = dash.run.metric_frames.frames.get(0)
        new = frame[frame["step"] > seen]
        latencies.extend(now - new["time"])
        seen = int(frame["step"].iloc[-1])

    dash.refresh()  # the history is read before the clock starts
    dash.on_refresh(on_refresh)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=writer_process, args=(str(run.folder), ranks, first_step, count, 0.1))
    proc.start()
    proc.join()
    deadline = time.monotonic() + 5
    while len(latencies) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    dash.stop()
    return latencies


# --- report ----------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def print_table(rows: list[tuple[str, list[float]]], unit: str) -> None:
    print(f"  {'what':42s} {'n':>4s} {'median':>9s} {'p95':>9s} {'max':>9s}  ({unit})")
    for name, values in rows:
        print(f"  {name:42s} {len(values):4d} {statistics.median(values):9.1f} {pct(values, 0.95):9.1f} "
              f"{max(values):9.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="64", help="world sizes to measure, comma-separated (e.g. 64,8)")
    parser.add_argument("--points", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--records", type=int, default=60)
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    met = True
    for ranks in [int(n) for n in args.ranks.split(",")]:
        met = measure(ranks, args) and met
    return 0 if met else 1


def measure(ranks: int, args: argparse.Namespace) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run = make_run(Path(tmp), ranks, args.points)
        print(f"\nrun folder: {ranks} ranks x {args.points} records ({time.perf_counter() - start:.1f} s to write)")
        target = refresh_target(ranks)
        print(f"\n(a) refresh cost, kernel side (target: incremental median <= {target:.0f} ms"
              + (f", first <= {FIRST_TARGET_S:.0f} s)" if ranks >= 64 else ")"))
        rows = bench_refresh(run, ranks, args.points, args.repeats)
        print_table(rows, "ms")
        first = args.points + 1 + 10 * (args.repeats + 3)
        print("\n(b) write -> dashboard latency, poll_s=1.0, writer every 100 ms "
              f"(target: p95 < {LATENCY_P95_TARGET_S} s)")
        latencies = bench_latency(run, ranks, first, args.records)
        print_table([("record write -> widgets set", [x * 1000 for x in latencies])], "ms")
    refresh_ok = statistics.median(dict(rows)["incremental refresh (+10 records/rank)"]) <= target
    first_ok = ranks < 64 or dict(rows)["first refresh (read all, first draw)"][0] <= FIRST_TARGET_S * 1000
    latency_ok = bool(latencies) and pct(latencies, 0.95) < LATENCY_P95_TARGET_S
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{ranks} ranks: incremental refresh target {'met' if refresh_ok else 'MISSED'}; first refresh "
          f"{'met' if first_ok else 'MISSED'}; latency target {'met' if latency_ok else 'MISSED'}")
    return refresh_ok and first_ok and latency_ok


if __name__ == "__main__":
    sys.exit(main())
