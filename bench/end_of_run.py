"""End-of-run cost of `workbench run`: what the command does after the ranks finish (issue 18's
target): the per-rank table printed, plots/loss.png written, the final state and next steps.

    python bench/end_of_run.py [--rounds 5] [--steps 192] [--ranks 2]

A finished run folder as the engine leaves it (the quickstart's shape by default: 2 ranks x 192
steps, every metric the engine logs, an eval every 25 steps) is written once.  Each round is a fresh
interpreter in the state `workbench run` is in when its ranks finish: workbench.cli imported, pandas
and the plotting module imported (EndPlot imports them in the background once the run logs), and
the run's records read by the follow loop's polls (Run.load, then the status poll).  Timed from
there, as the CLI runs it: the end plot started (EndPlot.when_ready) and the end said
(printing._say_end: the table, the plot's path, the state, what next), stdout captured.  Wall and
CPU time of the process, median of the rounds.  Target: <= 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.5
ROUND = """
import contextlib, io, json, sys, time
import pandas  # noqa - EndPlot's background import while the run trained
import workbench.cli.printing as printing
import workbench.results.plots  # noqa - idem
from workbench.launch.run import Run

run = Run.load(sys.argv[1])
status = run.latest_status = run.status(True)  # the follow loop's last poll: every record read
wall, cpu = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()) as out:
    plot = printing.EndPlot(run)
    plot.when_ready(status)
    code = printing._say_end(run, status, printing.FailureNotice(), plot)
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu, code, out.getvalue()]))
"""


def finished_run(root: Path, ranks: int, steps: int) -> Path:
    """A finished run folder of `ranks` x `steps` engine records and its evals (written once)."""
    sys.path.insert(0, str(REPO))
    from workbench.config import JobConfig
    from workbench.runfolder.layout import RunDir, write_json_atomic
    from workbench.runfolder.writer import JsonlWriter

    folder = root / f"end-{ranks}x{steps}"
    if (folder / "summary.json").exists():
        return folder
    cfg = JobConfig.from_yaml(REPO / "examples" / "quickstart.yaml").replace(dist__procs_per_node=ranks)
    run = RunDir(folder).prepare(cfg, "local")
    t0 = time.time() - 0.3 * steps
    events = JsonlWriter(run.events(0))
    events.write({"event": "start", "rank": 0, "step": 0, "time": t0, "total_steps": steps, "world_size": ranks,
                  "effective_batch": 64 * ranks, "lr": 2e-3})
    for rank in range(ranks):
        writer = JsonlWriter(run.metrics(rank))
        for step in range(1, steps + 1):
            loss = 1.4 * math.exp(-step / (steps / 3)) + 0.2 + 0.02 * math.sin(step * 7.1 + rank)
            writer.write({"rank": rank, "step": step, "epoch": step // 64, "time": t0 + 0.3 * step, "loss": loss,
                          "loss_reduced": loss, "lr": 2e-3 * min(1, step / 20), "step_time_s": 0.05 + 0.001 * rank,
                          "data_time_s": 0.001, "comm_wait_s": 0.01, "comm_busy_s": 0.012,
                          "samples_per_s": 1200.0, "mem_mb": 300.0 + rank, "attempt": 0})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": steps, "time": time.time()})
    for step in range(25, steps + 1, 25):
        events.write({"event": "eval", "rank": 0, "step": step, "time": t0 + 0.3 * step,
                      "val_loss": 1.0 / step ** 0.3, "val_accuracy": 0.5 + step / (2.5 * steps)})
    events.write({"event": "end", "rank": 0, "step": steps, "time": t0 + 0.3 * steps})
    events.close()
    write_json_atomic(run.summary, {"status": "finished", "steps": steps, "total_steps": steps, "world_size": ranks})
    return folder


def one_round(folder: Path) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", ROUND, str(folder)], capture_output=True, text=True, check=True,
                         env=env, cwd=REPO)
    wall, cpu, code, said = json.loads(out.stdout.strip().splitlines()[-1])
    if code != 0 or "per-rank plot" not in said:
        raise SystemExit(f"the end of the run was not said as expected (exit {code}):\n{said}")
    return wall, cpu, said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=192)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs")
    folder = finished_run(Path(tempfile.gettempdir()) / "workbench-end-bench", args.ranks, args.steps)
    print(f"end of `workbench run`, {args.ranks} ranks x {args.steps} steps ({folder})")
    walls, cpus = [], []
    for i in range(args.rounds):
        wall, cpu, said = one_round(folder)
        walls.append(wall)
        cpus.append(cpu)
        print(f"  round {i + 1}: {wall:6.3f} s wall {cpu:6.3f} s CPU", flush=True)
    print(said.rstrip())
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    verdict = 'met' if wall <= TARGET_S else 'MISSED'
    print(f"median {wall:.3f} s wall, {cpu:.3f} s CPU (target <= {TARGET_S} s) -> {verdict}")
    return 0 if wall <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
