"""Cost of PyTorch's flight recorder, which every rank's agent turns on (engine.flight, issue 28: at most 1%).

Two measures, each alternating rounds with the recorder on (TORCH_FR_BUFFER_SIZE=64, the default) and off (0),
the order swapped every round:

- per collective: one gloo rank (world size 1, its own process) issues N all_reduces of one float in 20
  blocks; the process's CPU time (all its threads) of the cheapest block is counted, since on a shared
  machine wall time mostly measures the wait for a core; the recorder records each call (number, op,
  sizes, the Python stack at the call), so the difference per call is its cost, with no peer's noise;
- per step: the 2-rank CPU engine job of bench/observability_overhead.py (default settings), median wall time
  of a step on rank 0, on/off per round.  Two collectives a step: one gradient bucket and the loss reduce.

The heartbeat's read of the recorder (engine.flight.last_collective) happens only once a rank has made no
progress for the stall limit: a healthy step never pays for it; its time is printed too.

    python bench/flight_recorder_overhead.py [--rounds 5] [--steps 300] [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from workbench.engine.flight import BUFFER_ENV, BUFFER_SIZE
from workbench.engine.rendezvous import free_port

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from observability_overhead import median_step_s  # noqa: E402

CALLS = """
import sys, time, torch, torch.distributed as dist
from workbench.engine.flight import last_collective
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
x, n = torch.ones(1), %d
for _ in range(200):
    dist.all_reduce(x)
blocks = []
for _ in range(20):  # the fastest block: a loaded machine only ever adds time
    start = time.process_time()  # CPU time of the process, every thread: waiting for a core adds none
    for _ in range(n // 20):
        dist.all_reduce(x)
    blocks.append((time.process_time() - start) / (n // 20))
per_call = min(blocks)
start = time.perf_counter()
for _ in range(100):
    last_collective()
print(per_call, (time.perf_counter() - start) / 100)
dist.destroy_process_group()
"""


def per_collective_s(on: bool, calls: int) -> tuple[float, float]:
    env = {**os.environ, BUFFER_ENV: str(BUFFER_SIZE if on else 0), "OMP_NUM_THREADS": "1"}
    for _ in range(3):  # the free port may be taken by another process before the group binds it
        done = subprocess.run([sys.executable, "-c", CALLS % (free_port(), calls)], env=env, capture_output=True,
                              text=True, timeout=600)
        if done.returncode == 0:
            out = done.stdout.split()
            return float(out[0]), float(out[1])
    raise RuntimeError(done.stderr[-2000:])


def step_s(root: str, steps: int, on: bool) -> float:
    before = os.environ.get(BUFFER_ENV)
    os.environ[BUFFER_ENV] = str(BUFFER_SIZE if on else 0)  # the ranks inherit it; the agent keeps a set value
    try:
        return median_step_s(root, steps, True)[0]
    finally:
        os.environ.pop(BUFFER_ENV) if before is None else os.environ.__setitem__(BUFFER_ENV, before)


def calls_only(rounds: int, calls: int) -> None:
    costs, on_s = [], []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        found = {on: per_collective_s(on, calls)[0] for on in order}
        costs.append(found[True] - found[False])
        on_s.append(found[True])
        print(f"round {i + 1}: all_reduce {found[False] * 1e6:.1f} us CPU off, {found[True] * 1e6:.1f} us on",
              flush=True)
    print(f"recorder cost per collective: {statistics.median(costs) * 1e6:+.1f} us, median of {rounds} rounds "
          f"({', '.join(f'{c * 1e6:+.1f}' for c in costs)}); an all_reduce on: {statistics.median(on_s) * 1e6:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--only", choices=("calls",), help="the per-collective measure alone (no engine runs)")
    args = parser.parse_args()
    if args.only == "calls":
        return calls_only(args.rounds, args.calls)
    call_costs, step_ratios, steps_on, reads = [], [], [], []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            calls = {on: per_collective_s(on, args.calls) for on in order}
            steps = {on: step_s(root, args.steps, on) for on in order}
            call_costs.append(calls[True][0] - calls[False][0])
            reads.append(calls[True][1])
            step_ratios.append(steps[True] / steps[False])
            steps_on.append(steps[True])
            print(f"round {i + 1}: all_reduce {calls[False][0] * 1e6:.1f} us off, {calls[True][0] * 1e6:.1f} us on; "
                  f"step {steps[False] * 1e3:.2f} ms off, {steps[True] * 1e3:.2f} ms on (x{step_ratios[-1]:.4f})",
                  flush=True)
    cost, step = statistics.median(call_costs), statistics.median(steps_on)
    print(f"recorder cost per collective: {cost * 1e6:+.1f} us (median of {args.rounds} rounds' on-off differences)")
    print(f"  -> 2 collectives a step: {100 * 2 * cost / step:+.3f}% of the {step * 1e3:.1f} ms step")
    print(f"step time on/off: median ratio {statistics.median(step_ratios):.4f} "
          f"(rounds: {', '.join(f'{r:.4f}' for r in step_ratios)}; target <= 1.01)")
    print(f"reading the recorder once (only while a rank is stalled): {statistics.median(reads) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
