"""How long `run.wait()` takes to return after the run shows done (issue 29: 2.4-2.9 s, then 1.0-1.4 s).

    python bench/run_wait.py [--rounds 5] [--against PATH]

Each round is a fresh interpreter that submits a tiny local run (2 ranks, 5 steps of the synthetic
task) and calls `run.wait()`, while a thread of its own reads the run folder every 5 ms: the moment
every rank's status says finished ("done", what the dashboard and `workbench show` say), and the
moment each process the folder names is gone (the workers, their agents, the local controller).
Printed per tree: the medians of those moments after "done", and when wait() returned.

wait() returns once nothing of the run is left (Run.job_ended: the controller's exit, and no agent
or worker alive), so what it waits for is the processes' own ends.  `--against PATH` runs the same
rounds from another checkout (e.g. `git worktree add /tmp/before HEAD~1`), alternating with this one
so both share the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUND = r"""
import json, sys, threading, time
import workbench
from workbench.config import JobConfig
from workbench.launch.run import Run

cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": {"n_train": 512}},
                           "train": {"micro_batch_size": 32, "max_steps": 5},
                           "dist": {"procs_per_node": 2, "threads_per_rank": 1},
                           "launch": {"run_root": sys.argv[1], "time_limit": "10"}})
run = workbench.submit(cfg)
marks, stop = {}, threading.Event()


def watch():
    folder, seen = run.dir, {}
    while not stop.is_set():
        now = time.monotonic()
        states = [(folder.read_status(r) or {}).get("state") for r in range(2)]
        if "done" not in marks and states == ["finished", "finished"]:
            marks["done"] = now
        for role in ("worker", "agent", "controller"):
            for proc in folder.recorded(role) if role != "controller" else [p for _, p in folder.named(role)]:
                key = (role, proc.pid)
                if proc.alive():
                    seen[key] = True
                elif seen.pop(key, False):  # gone since the last look
                    marks[role] = max(marks.get(role, 0.0), now)  # the last one of its role
        time.sleep(0.005)


thread = threading.Thread(target=watch, daemon=True)
thread.start()
run.wait(timeout=120)
marks["wait() returned"] = time.monotonic()
stop.set()
thread.join()
print(json.dumps({k: v - marks["done"] for k, v in marks.items() if k != "done"}))
"""


def one_round(tree: Path, root: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ROUND, root], env=env, cwd=tree, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout, run alternately with this one")
    args = parser.parse_args()
    trees = {"this checkout": REPO, **({f"against {args.against}": args.against.resolve()} if args.against else {})}
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                found[name].append(one_round(tree, root))
    print(f"load average {os.getloadavg()[0]:.1f}; seconds after every rank said finished, median of {args.rounds}:")
    for name, rounds in found.items():
        keys = ("worker", "agent", "controller", "wait() returned")
        parts = [f"{key} {statistics.median(r.get(key, float('nan')) for r in rounds):+.2f}" for key in keys]
        print(f"  {name:40s} last " + ", last ".join(parts[:3]) + f"; {parts[3]}")


if __name__ == "__main__":
    main()
