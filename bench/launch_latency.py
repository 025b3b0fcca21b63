"""Launch latency: from submit to the first logged training step, 2 ranks on CPU, same job.

    workbench.submit(cfg)            -> first record in metrics/rank0.jsonl
    raw submitit (LocalExecutor)     -> a hand-written DDP loop's first step
    torchrun --standalone            -> the same hand-written loop's first step

Rounds alternate the three so they share the machine's load; medians are reported.

Every launch above is a warm one (the submitting process paid its imports in an uncounted launch).
A new kernel's first launch also pays what the submitting process imports: `--fresh` rounds start
each launch from a new interpreter (`import time` first; this module's imports, submitit and
workbench, count for both) and report seconds from the interpreter's first line to the first step,
and how long workbench.submit's first call takes to return.

    python bench/launch_latency.py [--rounds 5] [--fresh]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import submitit

import workbench
from workbench.config import JobConfig
from workbench.engine.rendezvous import free_port

HAND_LOOP = Path(__file__).with_name("hand_ddp_loop.py")


def workbench_latency(root: str) -> float:
    cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": {"n_train": 4096}},
                               "train": {"micro_batch_size": 32, "max_steps": 5},
                               "dist": {"procs_per_node": 2}, "launch": {"run_root": root, "time_limit": "10"}})
    start = time.time()
    run = workbench.submit(cfg)
    SUBMIT_RETURNED.append(time.time() - start)
    path = run.dir.metrics(0)
    while not (path.exists() and path.read_text().strip()):
        time.sleep(0.005)
    first = json.loads(path.read_text().splitlines()[0])["time"]
    run.wait(timeout=120)
    return first - start


FRESH = """
import time
t0 = time.time()
import sys
sys.path.insert(0, {bench!r})
import launch_latency
call = time.time()
latency = launch_latency.{fn}({root!r})
print(call - t0 + latency, launch_latency.SUBMIT_RETURNED[-1] if launch_latency.SUBMIT_RETURNED else 0.0)
"""
SUBMIT_RETURNED: list[float] = []
"""Seconds each workbench.submit(cfg) call of this process took to return."""


def fresh_latency(fn: str, root: str) -> tuple[float, float]:
    """(seconds from a new interpreter's first line to the first step, seconds its submit call took)."""
    bench = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", FRESH.format(bench=bench, fn=fn, root=root)], capture_output=True,
                         text=True, check=True, timeout=300, env={**os.environ, "PYTHONPATH": bench})
    first, call = out.stdout.split()[-2:]
    return float(first), float(call)


def _hand_loop_in_task(port: int, out: str) -> None:
    env = submitit.JobEnvironment()
    os.environ.update(RANK=str(env.global_rank), LOCAL_RANK=str(env.local_rank), WORLD_SIZE=str(env.num_tasks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FIRST_STEP_FILE=out)
    import runpy

    runpy.run_path(str(HAND_LOOP), run_name="__main__")


def submitit_latency(root: str) -> float:
    out = os.path.join(root, f"first-{time.time_ns()}")
    executor = submitit.LocalExecutor(folder=os.path.join(root, "raw"))
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=10)
    start = time.time()
    job = executor.submit(_hand_loop_in_task, free_port(), out)
    job.results()
    return float(Path(out).read_text()) - start


def torchrun_latency(root: str) -> float:
    out = os.path.join(root, f"first-{time.time_ns()}")
    env = {**os.environ, "FIRST_STEP_FILE": out}
    start = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(HAND_LOOP)], env=env, check=True, capture_output=True, timeout=300)
    return float(Path(out).read_text()) - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="each launch from a new interpreter")
    args = parser.parse_args()
    if args.fresh:
        fresh(args.rounds)
        return
    results: dict[str, list[float]] = {"workbench.submit": [], "raw submitit": [], "torchrun --standalone": []}
    with tempfile.TemporaryDirectory() as root:
        workbench_latency(root)  # warm the file cache once; not counted
        for i in range(args.rounds):
            results["workbench.submit"].append(workbench_latency(root))
            results["raw submitit"].append(submitit_latency(root))
            results["torchrun --standalone"].append(torchrun_latency(root))
            print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items()), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    for name, value in med.items():
        print(f"{name:24s} median {value:.2f} s")
    print(f"workbench / raw submitit: {med['workbench.submit'] / med['raw submitit']:.2f} (target <= 1.1); "
          f"workbench / torchrun: {med['workbench.submit'] / med['torchrun --standalone']:.2f} (target < 1)")


def fresh(rounds: int = 5) -> None:
    """Launches from a new interpreter each: workbench.submit against raw submitit, alternating."""
    wb: list[float] = []
    raw: list[float] = []
    calls: list[float] = []
    with tempfile.TemporaryDirectory() as root:
        fresh_latency("workbench_latency", root)  # the file cache warmed once; not counted
        for i in range(rounds):
            first, call = fresh_latency("workbench_latency", root)
            wb.append(first)
            calls.append(call)
            raw.append(fresh_latency("submitit_latency", root)[0])
            print(f"round {i + 1}: workbench.submit {wb[-1]:.2f} s (its call {call:.2f} s)  "
                  f"raw submitit {raw[-1]:.2f} s", flush=True)
    w, r = statistics.median(wb), statistics.median(raw)
    print(f"from a new interpreter: workbench.submit median {w:.2f} s, raw submitit median {r:.2f} s, "
          f"ratio {w / r:.2f}; workbench.submit's first call median {statistics.median(calls):.2f} s")


if __name__ == "__main__":
    main()
