"""Launch latency: from submit to the first logged training step, 2 ranks on CPU, same job.

    workbench.submit(cfg)            -> first record in metrics/rank0.jsonl
    (and, apart: how long a fresh interpreter's first submit() call takes to return, its imports
    included: what a new kernel's first cell pays before the ranks start)
    raw submitit (LocalExecutor)     -> a hand-written DDP loop's first step
    torchrun --standalone            -> the same hand-written loop's first step

Rounds alternate the three so they share the machine's load; medians are reported.

    python bench/launch_latency.py [--rounds 5]
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
    path = run.dir.metrics(0)
    while not (path.exists() and path.read_text().strip()):
        time.sleep(0.005)
    first = json.loads(path.read_text().splitlines()[0])["time"]
    run.wait(timeout=120)
    return first - start


FIRST_SUBMIT = """
import sys, time, workbench
from workbench.config import JobConfig
cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": {"n_train": 4096}},
                           "train": {"micro_batch_size": 32, "max_steps": 5},
                           "dist": {"procs_per_node": 2}, "launch": {"run_root": sys.argv[1], "time_limit": "10"}})
start = time.perf_counter()
run = workbench.submit(cfg)
print(time.perf_counter() - start)
run.wait(timeout=120)
"""


def first_submit_call(root: str) -> float:
    """Seconds a fresh interpreter's first workbench.submit(cfg) takes to return (`import workbench` paid)."""
    out = subprocess.run([sys.executable, "-c", FIRST_SUBMIT, root], capture_output=True, text=True,
                         check=True, timeout=300)
    return float(out.stdout.split()[0])


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
    args = parser.parse_args()
    results: dict[str, list[float]] = {"workbench.submit": [], "raw submitit": [], "torchrun --standalone": []}
    with tempfile.TemporaryDirectory() as root:
        workbench_latency(root)  # warm the file cache once; not counted
        for i in range(args.rounds):
            results["workbench.submit"].append(workbench_latency(root))
            results["raw submitit"].append(submitit_latency(root))
            results["torchrun --standalone"].append(torchrun_latency(root))
            print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items()), flush=True)
        first = [first_submit_call(root) for _ in range(args.rounds)]
    print(f"first submit() call in a fresh interpreter: median {statistics.median(first):.2f} s "
          f"(rounds {', '.join(f'{x:.2f}' for x in first)})")
    med = {k: statistics.median(v) for k, v in results.items()}
    for name, value in med.items():
        print(f"{name:24s} median {value:.2f} s")
    print(f"workbench / raw submitit: {med['workbench.submit'] / med['raw submitit']:.2f} (target <= 1.1); "
          f"workbench / torchrun: {med['workbench.submit'] / med['torchrun --standalone']:.2f} (target < 1)")


if __name__ == "__main__":
    main()
