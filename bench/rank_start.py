"""What starting runs costs a session that submits several, as a notebook does: the default (each
engine run's ranks forked from a controller that imported torch once, workbench.engine.forked; from
the second run on, that controller forked from the session's warm starter, workbench.launch.starter)
vs every controller, agent and worker a fresh process (WORKBENCH_FORK=0).  Alternating rounds, a
fresh interpreter a session.

    python bench/rank_start.py --rounds 3 [--runs 4] [--ranks 2] [--steps 5] [--payload script]

`--payload script`: the runs are a user's DDP script (`workbench.submit_script`, a torch.nn.Linear
under DDP that calls workbench.log every step): its ranks are forked from the run's own controller,
which imported torch without torch._dynamo; from the second on, that controller is forked from the
session's starter for user code (workbench.engine.forked.ENGINE_PRELOAD says why it is another).

Per session: CPU-seconds of everything it ran (the submitting interpreter and every process it
reaped, which holds the controllers it started and, through them, the agents and workers; plus the
starter and what it reaped, read from /proc before the session ends), and for each run the seconds
from calling `workbench.submit` to rank 0's first logged step (the second run waits in the call for
the starter's imports).  Prints medians, and median ratios
(default / fresh) of the session's CPU and of each run's latency."""

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

SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, workbench
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, int(sys.argv[1]) + 1):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        workbench.log(step=step, loss=loss)
    dist.destroy_process_group()
    """)
SESSION = textwrap.dedent("""
    import json, os, sys, time
    import workbench
    from workbench.config import JobConfig
    from workbench.launch import starter
    root, runs, steps, ranks, payload = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    cfg = JobConfig.from_dict({"task": {"name": "synthetic"}, "train": {"max_steps": steps,
                               "checkpoint_every_steps": None},
                               "dist": {"procs_per_node": ranks}, "launch": {"run_root": root}})
    script = os.path.join(root, "ddp_script.py")  # written by the bench (SCRIPT)
    latencies = []
    for _ in range(runs):
        submitted = time.time()  # before the call: a run may wait in it for a starter still importing
        if payload == "script":
            run = workbench.submit_script(script, [str(steps)], cfg, nproc=ranks)
        else:
            run = workbench.submit(cfg)
        assert run.wait(timeout=300).state == "finished"
        latencies.append(float(run.metrics().query("rank == 0")["time"].min() - submitted))
        for one in starter.starters():  # as a user between cells: the starter has time to warm up
            deadline = time.monotonic() + 60
            while not one.usable(dict(os.environ)) and time.monotonic() < deadline:
                time.sleep(0.1)
    starter_cpu = 0.0
    for one in starter.starters():
        if one.process.poll() is None:
            with open(f"/proc/{one.process.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            starter_cpu += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    print(json.dumps({"latencies": latencies, "starter_cpu": starter_cpu}))
    """)


def session(mode: str, root: str, runs: int, steps: int, ranks: int, payload: str) -> dict[str, object]:
    env = {**os.environ, "WORKBENCH_FORK": "1" if mode == "default" else "0"}
    with open(os.path.join(root, "ddp_script.py"), "w") as fh:
        fh.write(SCRIPT)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", SESSION, root, str(runs), str(steps), str(ranks), payload], env=env,
                          capture_output=True, text=True, timeout=1200, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + result["starter_cpu"]
    return {"cpu_s": cpu, "latencies": result["latencies"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--payload", choices=("engine", "script"), default="engine")
    args = parser.parse_args()
    rows: dict[str, list[dict[str, object]]] = {"default": [], "fresh": []}
    with tempfile.TemporaryDirectory() as root:
        for round_ in range(args.rounds):
            for mode in (("default", "fresh") if round_ % 2 == 0 else ("fresh", "default")):
                rows[mode].append(session(mode, root, args.runs, args.steps, args.ranks, args.payload))
                print(mode, json.dumps(rows[mode][-1]), "load", os.getloadavg()[0], flush=True)
    cpu = {mode: statistics.median(float(r["cpu_s"]) for r in found) for mode, found in rows.items()}
    latency = {mode: [statistics.median(float(r["latencies"][i]) for r in found)  # type: ignore[index]
                      for i in range(args.runs)] for mode, found in rows.items()}
    print(json.dumps({
        "payload": args.payload, "ranks": args.ranks, "runs_a_session": args.runs, "steps": args.steps,
        "rounds": args.rounds,
        "median_session_cpu_s": cpu, "median_first_step_s_by_run": latency,
        "median_ratio_default_over_fresh": {
            "session_cpu": statistics.median(float(d["cpu_s"]) / float(f["cpu_s"])
                                             for d, f in zip(rows["default"], rows["fresh"])),
            "first_step_by_run": [statistics.median(float(d["latencies"][i]) / float(f["latencies"][i])  # type: ignore[index]
                                                    for d, f in zip(rows["default"], rows["fresh"]))
                                  for i in range(args.runs)]}}, indent=1))


if __name__ == "__main__":
    main()
