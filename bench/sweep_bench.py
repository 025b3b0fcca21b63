"""Sweeps: trials per minute for small jobs (2 ranks, 5 steps, CPU), and each trial's start latency
(from the driver's submit to rank 0's start event), by where the trials run:

    cold      workbench.sweep(cfg, grid)                 fresh local ranks per trial, one at a time
    cold x2   workbench.sweep(cfg, grid, parallel=2)     two trials at once
    pool      workbench.sweep(cfg, grid, pool=Pool(cfg)) one warm pool, one trial after another
    slurm     --slurm: launch.executor slurm, parallel=2: the trials are ONE job array
              (sbatch --array=0-N%2), each element bound to its trial when it starts; needs a
              cluster (WORKBENCH_SLURM_PARTITION, else its default partition), or as root
              --test-cluster starts the tests' own two-node cluster on this machine for the bench

Wall time, this process's and its children's CPU time and the load average are printed with every
figure: on a shared machine the wall figures are noise, the CPU figures less so.  Target: a pool
trial starts in < 0.5 s (median start latency).

    python bench/sweep_bench.py [--trials 6] [--modes cold,cold2,pool] [--slurm [--test-cluster]]
    python bench/sweep_bench.py --trials 4 --modes "" --slurm --test-cluster     # the SLURM row alone

For SLURM the start latency is from the element's binding (the driver's answer) to rank 0's start
event; `queue s` is from the array's submission to the first trial's rank 0 starting (sbatch,
the scheduler, the element's Python and submitit, the binding)."""


from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import workbench
from workbench.config import JobConfig

POOL_TARGET_S = 0.5


def job_cfg(root: str, slurm: bool = False) -> JobConfig:
    launch: dict = {"run_root": root, "time_limit": "10"}
    if slurm:
        launch |= {"executor": "slurm", "slurm": {"partition": os.environ.get("WORKBENCH_SLURM_PARTITION"),
                                                  "cpus_per_task": 1}}
    return JobConfig.from_dict({"task": {"name": "synthetic", "options": {"n_train": 1024, "n_val": 64}},
                                "train": {"micro_batch_size": 32, "max_steps": 5, "eval_every_steps": 5,
                                          "checkpoint_every_steps": None},
                                "dist": {"procs_per_node": 2, "threads_per_rank": 1}, "launch": launch})


def cpu_s() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def measure(label: str, trials: int, root: str, **options) -> dict:
    cfg = job_cfg(root, options.pop("slurm", False))
    grid = {"train.lr": [1e-3 * (1 + i) for i in range(trials)]}
    load = os.getloadavg()[0]
    cpu0, t0 = cpu_s(), time.monotonic()
    sweep = workbench.sweep(cfg, grid, pruner="none", metric="val_loss", name=label, **options).wait(timeout=1800)
    wall, cpu = time.monotonic() - t0, cpu_s() - cpu0
    frame = sweep.frame()
    assert set(frame["state"]) == {"finished"}, frame
    latency = frame["start_latency_s"].dropna().tolist()
    arrays = (sweep.dir.read_meta() or {}).get("arrays") or []
    queue = float("nan")
    if arrays:
        starts = [(r.event_summary().start or {}).get("time") for r in sweep.runs]
        queue = min(float(t) for t in starts if t) - float(arrays[0]["submitted"])
    return {"queue_s": queue, "arrays": [f"{a['job_id']}x{a['size']}" for a in arrays],
            "mode": label, "trials": trials, "wall_s": wall, "trials_per_min": 60 * trials / wall, "cpu_s": cpu,
            "start_latency_median_s": statistics.median(latency) if latency else float("nan"),
            "start_latency_max_s": max(latency) if latency else float("nan"), "load_before": load,
            "load_after": os.getloadavg()[0]}


@contextlib.contextmanager
def test_cluster(wanted: bool):
    """The tests' own SLURM cluster (slurmctld, slurmdbd, two slurmd on this machine) for the bench."""
    if not wanted:
        yield
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.support.slurm_cluster import SlurmCluster

    with SlurmCluster() as cluster:
        os.environ.update(cluster.env)
        os.environ["WORKBENCH_SLURM_PARTITION"] = cluster.partition
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--modes", default="cold,cold2,pool")
    parser.add_argument("--slurm", action="store_true", help="also SLURM (a running cluster)")
    parser.add_argument("--test-cluster", action="store_true", help="start the tests' SLURM cluster for --slurm")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-", dir=os.getcwd() if args.slurm else None) as root, \
            test_cluster(args.slurm and args.test_cluster):
        for mode in filter(None, args.modes.split(",")):
            if mode == "cold":
                rows.append(measure("cold", args.trials, root))
            elif mode == "cold2":
                rows.append(measure("cold-x2", args.trials, root, parallel=2))
            elif mode == "pool":
                with workbench.Pool(job_cfg(root), idle_timeout_s=600) as pool:
                    pool.wait_ready(300)
                    rows.append(measure("pool", args.trials, root, pool=pool))
        if args.slurm:
            rows.append(measure("slurm", args.trials, root, slurm=True, parallel=2))
    print(f"{'mode':8} {'trials':>6} {'wall s':>7} {'trials/min':>10} {'CPU s':>7} {'start med s':>11} "
          f"{'start max s':>11} {'queue s':>7} {'load':>11}")
    for r in rows:
        print(f"{r['mode']:8} {r['trials']:6d} {r['wall_s']:7.1f} {r['trials_per_min']:10.1f} {r['cpu_s']:7.1f} "
              f"{r['start_latency_median_s']:11.3f} {r['start_latency_max_s']:11.3f} {r['queue_s']:7.1f} "
              f"{r['load_before']:5.2f}>{r['load_after']:5.2f}")
    for r in rows:
        if r["arrays"]:
            print(f"{r['mode']}: job arrays (id x elements) {json.dumps(r['arrays'])}")
    pool = next((r for r in rows if r["mode"] == "pool"), None)
    if pool is not None:
        verdict = "meets" if pool["start_latency_median_s"] < POOL_TARGET_S else "misses"
        print(f"pool trial start (median) {pool['start_latency_median_s']:.3f} s: {verdict} the < "
              f"{POOL_TARGET_S} s target")


if __name__ == "__main__":
    main()
