"""How fast a launcher shows what a rank printed, and how fast it names a failure and exits:
`workbench launch` vs `torchrun --standalone`, side by side, alternating rounds.

The same plain script (bench/failing_script.py, no workbench import), 2 ranks on this machine:

- print lag: rank 0 prints a line every 0.25 s without flush, with the time it printed it; the lag
  is when the line arrives on the launcher's stdout (a pipe, as under `| tee` or a CI log) minus
  that time.
- failure: rank 1 raises after 20 steps, noting when; measured from then: the first line naming the
  error ("injected failure"), the launcher's summary naming the failed rank (workbench's
  "[workbench] rank 1 ... raised" line; torchrun's "Root Cause" block), the launcher's exit; and
  how many stderr lines and tracebacks the user got.

- hang (`--hang-rounds N`, `--only hang`): per shape of user code, rank 1 hangs (asleep in Python at its
  step 8, or stopped by SIGSTOP, or in a different collective from rank 0), noting when; measured from
  then to the user holding the named failure: `run.wait()` returning with rank 1 Hung (or Lost) for
  submitted code, the `[workbench] rank 1 (...) hung` line for `workbench launch`.  Every shape runs with
  `dist.stall_after_s` (and `dist.lost_after_s`) = --stall-s; a latency is that limit plus the time to see
  it.  The shapes are those of tests/ddp/test_hang_shapes.py (bench_hang.py holds their code); `--slurm`
  adds a script through the SLURM executor on the tests' own cluster (tests/support/slurm_cluster.py,
  started or joined, under the tests' machine lock so no SLURM test runs beside it).

    python bench/failure_latency.py [--rounds 5] [--lines 20] [--hang-rounds 1] [--stall-s 10] [--only hang]
                                    [--slurm] [--shapes lightning,slurm]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

SCRIPT = Path(__file__).with_name("failing_script.py")
HANG = Path(__file__).with_name("bench_hang.py")
SHAPES = {"factory": "a factory in the submitting file, stuck in its loss",
          "submit_fn": "submit_fn, stuck in Python",
          "script": "workbench launch, a script without workbench.log, stuck",
          "pool": "a warm pool's submit_fn, stuck in Python",
          "collectives": "submit_fn, ranks in different collectives",
          "sigstop": "the built-in task, a rank SIGSTOPped (dist.lost_after_s)",
          "lightning": "a Lightning Trainer script (submit_script), stuck in training_step",
          "loader": "a factory, data.num_workers 1, stuck in its DataLoader worker's __getitem__"}
SLURM_SHAPE = {"slurm": "a script on SLURM (2 nodes x 1 rank), stuck"}
SUMMARY = {"torchrun": re.compile(r"Root Cause"), "workbench": re.compile(r"^\[workbench\] rank 1\b.*raised")}


def command(launcher: str, folder: Path) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [sys.executable, "-m", "workbench.cli", "launch", "--nproc", "2",
            "--set", f"launch.run_root={folder / 'runs'}"]


def run_timed(cmd: list[str]) -> tuple[list[tuple[float, str, str]], float, int]:
    """Run `cmd`; every line of its stdout and stderr with the time it arrived; exit time and code."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    lines: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def read(stream, name):
        for raw in iter(stream.readline, b""):
            with lock:
                lines.append((time.time(), name, raw.decode(errors="replace").rstrip("\n")))

    readers = [threading.Thread(target=read, args=(proc.stdout, "out")),
               threading.Thread(target=read, args=(proc.stderr, "err"))]
    for t in readers:
        t.start()
    code = proc.wait(timeout=600)
    ended = time.time()
    for t in readers:
        t.join()
    return sorted(lines), ended, code


def print_lag(launcher: str, folder: Path, lines: int) -> float:
    found, _, code = run_timed([*command(launcher, folder), str(SCRIPT), "print", str(lines), "0.25"])
    lags = [at - float(m.group(1)) for at, _, text in found if (m := re.search(r"tick \d+ ([\d.]+)", text))]
    if code != 0 or len(lags) != lines:
        raise RuntimeError(f"{launcher}: exit {code}, {len(lags)} of {lines} lines")
    return statistics.median(lags)


def failure(launcher: str, folder: Path) -> dict[str, float]:
    out = folder / f"raised-{time.monotonic_ns()}.json"
    found, ended, code = run_timed([*command(launcher, folder), str(SCRIPT), "fail", str(out)])
    raised = json.loads(out.read_text())["raised_at"]
    named = next((at for at, _, text in found if "injected failure" in text), float("nan"))
    summary = next((at for at, _, text in found if SUMMARY[launcher].search(text)), float("nan"))
    err = [text for _, kind, text in found if kind == "err"]
    return {"named_s": named - raised, "summary_s": summary - raised, "exit_s": ended - raised, "code": code,
            "stderr_lines": len(err), "tracebacks": sum("Traceback" in t for t in err)}


def launcher_rounds(rounds: int, lines: int, folder: Path) -> None:
    lags: dict[str, list[float]] = {"torchrun": [], "workbench": []}
    fails: dict[str, list[dict[str, float]]] = {"torchrun": [], "workbench": []}
    for i in range(rounds):
        order = ("torchrun", "workbench") if i % 2 == 0 else ("workbench", "torchrun")
        for name in order:
            lags[name].append(print_lag(name, folder, lines))
            fails[name].append(failure(name, folder))
        print(f"round {i + 1}: " + "; ".join(
            f"{name}: print lag {lags[name][-1]:.3f} s, error shown {fails[name][-1]['named_s']:.2f} s, "
            f"summary {fails[name][-1]['summary_s']:.2f} s, exit {fails[name][-1]['exit_s']:.2f} s "
            f"(code {fails[name][-1]['code']}, {fails[name][-1]['stderr_lines']} stderr lines, "
            f"{fails[name][-1]['tracebacks']} tracebacks)" for name in ("torchrun", "workbench")), flush=True)
    for name in ("torchrun", "workbench"):
        med = {k: statistics.median(f[k] for f in fails[name]) for k in fails[name][0]}
        print(f"{name:9s} median: print lag {statistics.median(lags[name]):.3f} s; from the raise: error shown "
              f"{med['named_s']:.2f} s, summary {med['summary_s']:.2f} s, exit {med['exit_s']:.2f} s; "
              f"{med['stderr_lines']:.0f} stderr lines, {med['tracebacks']:.0f} tracebacks")


def hang_rounds(rounds: int, stall_s: float, folder: Path, shapes: dict[str, str]) -> None:
    """The hang column: per shape, from the hang to the named failure (bench_hang.py runs each shape)."""
    found: dict[str, list[float]] = {}
    for i in range(rounds):
        for shape in shapes:
            cmd = [sys.executable, str(HANG), shape, str(folder / "runs"), str(stall_s)]
            with test_cluster(shape in SLURM_SHAPE) as env:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, **env})
            said = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
            if said is None or said["message"] is None:
                raise RuntimeError(f"{shape}: exit {done.returncode}\n{done.stderr[-3000:]}")
            found.setdefault(shape, []).append(said["latency_s"])
            print(f"hang round {i + 1} {shape:12s} {said['latency_s']:6.1f} s  rank {said['rank']} {said['type']}: "
                  f"{said['message'][:160]}", flush=True)
    for shape, seconds in found.items():
        print(f"hang {shapes[shape]:58s} median {statistics.median(seconds):6.1f} s from the hang to the named failure "
              f"(limit {stall_s:.0f} s; {len(seconds)} rounds: {', '.join(f'{x:.1f}' for x in seconds)})")


@contextlib.contextmanager
def test_cluster(wanted: bool) -> Iterator[dict[str, str]]:
    """The tests' SLURM cluster for one shape's run (started, or joined where a test session runs it), under the
    tests' machine lock, so no SLURM test runs beside the bench's job: yields the variables its clients need."""
    if not wanted:
        yield {}
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.exclusive import held
    from tests.support.slurm_cluster import shared

    with held("machine"), shared() as cluster:
        yield {**cluster.env, "WORKBENCH_SLURM_PARTITION": cluster.partition}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--hang-rounds", type=int, default=1)
    parser.add_argument("--stall-s", type=float, default=10.0)
    parser.add_argument("--only", choices=("launchers", "hang"))
    parser.add_argument("--slurm", action="store_true", help="the hang column on the tests' SLURM cluster too")
    parser.add_argument("--shapes", help="the hang column's shapes, comma-separated (default: all)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="failure-bench-"))
    if args.only != "hang":
        launcher_rounds(args.rounds, args.lines, folder)
    if args.only != "launchers":
        shapes = {**SHAPES, **(SLURM_SHAPE if args.slurm else {})}
        picked = args.shapes.split(",") if args.shapes else list(shapes)
        unknown = [name for name in picked if name not in shapes]
        if unknown:
            parser.error(f"--shapes: no shape {', '.join(unknown)}; the shapes are {', '.join(shapes)}"
                         + ("" if args.slurm else " (slurm with --slurm)"))
        hang_rounds(args.hang_rounds, args.stall_s, folder, {name: shapes[name] for name in picked})


if __name__ == "__main__":
    main()
