"""Warm ranks: seconds from submit to the first logged step, 2 ranks on CPU, the same job.

    workbench.submit(cfg)       cold: controller, Python, import torch, process group, DDP, first step
    pool.submit(cfg)            a warm workbench.Pool: the job's own work only (task, DDP, first step)
    torchrun --standalone       a hand-written DDP loop's first step (as in launch_latency.py)

Rounds alternate the three so they share the machine's load; medians are reported, and the
ratio warm / cold (target: warm <= 0.5 s and <= 0.2 x cold).

    python bench/warm_pool.py [--rounds 5]
    python bench/warm_pool.py --slurm [--rounds 3]   # a pool vs resubmitting through the queue
                                                     # (WORKBENCH_SLURM_PARTITION, a running cluster)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import workbench
from workbench.config import JobConfig

try:
    from launch_latency import torchrun_latency
except ImportError:  # run from the repo root as bench/warm_pool.py
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from launch_latency import torchrun_latency


def job_cfg(root: str, slurm: bool = False) -> JobConfig:
    launch: dict = {"run_root": root, "time_limit": "10"}
    dist = {"procs_per_node": 2, "threads_per_rank": 1}
    if slurm:
        launch |= {"executor": "slurm", "slurm": {"partition": os.environ.get("WORKBENCH_SLURM_PARTITION")}}
        dist = {"nodes": 2, "procs_per_node": 1, "threads_per_rank": 1}
    return JobConfig.from_dict({"task": {"name": "synthetic", "options": {"n_train": 4096}},
                                "train": {"micro_batch_size": 32, "max_steps": 5}, "dist": dist, "launch": launch})


def first_step_latency(submit, timeout_s: float = 600) -> float:
    """submit() -> a Run; seconds from the call to rank 0's first logged step (its record's time)."""
    start = time.time()
    run = submit()
    path = run.dir.metrics(0)
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no step logged in {run.folder}: {run.status()}")
        time.sleep(0.005)
    first = json.loads(path.read_text().splitlines()[0])["time"]
    status = run.wait(timeout=timeout_s)
    assert status.state == "finished", run.exception()
    return first - start


def torchrun_once_more(root: str) -> float:
    """torchrun's latency; one more try when it fails (on a loaded machine its rendezvous sometimes does)."""
    import subprocess

    try:
        return torchrun_latency(root)
    except subprocess.CalledProcessError as exc:
        print(f"torchrun failed ({exc.stderr.decode(errors='replace').strip().splitlines()[-1:]}); once more")
        return torchrun_latency(root)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slurm", action="store_true", help="a SLURM pool vs submitting through the queue")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("WORKBENCH_BENCH_DIR")) as root:
        cfg = job_cfg(root, args.slurm)
        cold_name = "submit through the queue" if args.slurm else "workbench.submit (cold)"
        results: dict[str, list[float]] = {cold_name: [], "warm pool": []}
        if not args.slurm:
            results["torchrun --standalone"] = []
        started = time.monotonic()
        with workbench.Pool(cfg, idle_timeout_s=1800) as pool:
            pool.wait_ready(600)
            print(f"pool up in {time.monotonic() - started:.1f} s (paid once)", flush=True)
            first_step_latency(lambda: pool.submit(cfg))  # warm the file cache once; not counted
            for i in range(args.rounds):
                results[cold_name].append(first_step_latency(lambda: workbench.submit(cfg)))
                results["warm pool"].append(first_step_latency(lambda: pool.submit(cfg)))
                if not args.slurm:
                    results["torchrun --standalone"].append(torchrun_once_more(root))
                print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items()), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    for name, value in med.items():
        print(f"{name:26s} median {value:.2f} s")
    ratio = med["warm pool"] / med[cold_name]
    print(f"warm / cold: {ratio:.3f} (target <= 0.2); warm median {med['warm pool']:.2f} s (target <= 0.5 s)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
