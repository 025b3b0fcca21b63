"""What starting a run's ranks costs: forked from a local controller that imported torch once
(workbench.engine.forked, the default for engine runs) vs every agent and worker a fresh process
(WORKBENCH_FORK=0), alternating rounds, a fresh interpreter a run.

    python bench/rank_start.py --rounds 5 [--ranks 2] [--steps 5]

Per run: CPU-seconds of the whole process tree (the submitting interpreter, the local controller, the
agents, the workers: every one of them is reaped by its parent, so RUSAGE_CHILDREN holds them all),
and seconds from `workbench.submit` returning to rank 0's first logged step.  Prints the medians
and the median ratios (forked / fresh)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent("""
    import json, sys, time
    import workbench
    from workbench.config import JobConfig
    cfg = JobConfig.from_dict({"task": {"name": "synthetic"}, "train": {"max_steps": int(sys.argv[2]),
                               "checkpoint_every_steps": None},
                               "dist": {"procs_per_node": int(sys.argv[3])}, "launch": {"run_root": sys.argv[1]}})
    start = time.time()
    run = workbench.submit(cfg)
    submitted = time.time()
    status = run.wait(timeout=300)
    first = run.metrics().query("rank == 0")["time"].min()
    print(json.dumps({"state": status.state, "first_step_s": first - submitted, "submit_s": submitted - start}))
    """)


def one(mode: str, root: str, steps: int, ranks: int) -> dict[str, float]:
    env = {**os.environ, "WORKBENCH_FORK": "1" if mode == "forked" else "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CHILD, root, str(steps), str(ranks)], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["state"] == "finished", result
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "first_step_s": result["first_step_s"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, list[dict[str, float]]] = {"forked": [], "fresh": []}
    with tempfile.TemporaryDirectory() as root:
        for round_ in range(args.rounds):
            for mode in (("forked", "fresh") if round_ % 2 == 0 else ("fresh", "forked")):
                figures[mode].append(one(mode, root, args.steps, args.ranks))
                print(mode, figures[mode][-1], "load", os.getloadavg()[0], flush=True)
    summary = {mode: {key: statistics.median(r[key] for r in rows) for key in ("cpu_s", "first_step_s")}
               for mode, rows in figures.items()}
    ratios = {key: statistics.median(f[key] / c[key] for f, c in zip(figures["forked"], figures["fresh"]))
              for key in ("cpu_s", "first_step_s")}
    print(json.dumps({"ranks": args.ranks, "steps": args.steps, "rounds": args.rounds, "median": summary,
                      "median_ratio_forked_over_fresh": ratios}, indent=1))


if __name__ == "__main__":
    main()
