"""Steady-state training throughput: the engine as users launch it vs a hand-written DDP loop
launched by torchrun, side by side.

    hand-written   torchrun --standalone --nproc_per_node=2 bench/hand_ddp_loop.py
                   (DistributedSampler, DDP with torch's defaults, AdamW, clip, no logging)
    engine         workbench.submit(cfg) + run.wait(): local controller -> one agent per rank ->
                   worker (python -m workbench.engine.worker), logging a record every step

Same model (synthetic 16-class MLP 256 -> 1024 -> 16), data, sampler, batch (64 per rank),
optimizer (AdamW, lr 1e-3, no weight decay), gradient clipping at 1.0; 2 ranks on gloo, 1 thread per
rank (torchrun's OMP_NUM_THREADS=1, the engine's dist.threads_per_rank=1).  Rounds alternate which
side runs first, so both see the same machine load.

Steady-state samples/s of one side = samples of the steps after --warmup / wall time from the end of
step --warmup to the end of the last step (rank 0's clock: the engine's per-step records, the hand
loop's own per-step times).  The verdict is the median of the per-round ratios.

Beside wall time, every round samples the CPU time (utime + stime, /proc/PID/task/TID/stat) of every
process this bench started -- the ranks (main thread and other threads apart), the launcher side
(torchrun's agent; the engine's controller and agents) and this process (run.wait's polling) -- and
reports it per training step over the same steady window, with the ranks' minor page faults and
context switches per step: CPU time is robust to other work on a shared machine where wall time
is not, and page faults tell whether a side pays for memory malloc handed back to the OS.

    python bench/engine_throughput.py [--rounds 7] [--steps 2000] [--json FILE]
        [--also-engine CHECKOUT]    a third side: the engine of another checkout (e.g. the commit
                                    before a change: git worktree add /tmp/before HEAD~1)
        [--steady-malloc]           the same fixed glibc malloc thresholds for every side
        [--hand-args="--bucket-cap-mb 25 --gradient-as-bucket-view"]   DDP options of the hand loop
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import workbench
from workbench.config import JobConfig
from workbench.proctree import Proc, end

HAND_LOOP = Path(__file__).with_name("hand_ddp_loop.py")
HAND_LOOPS = ("hand_ddp_loop.py", "hand_fsdp_loop.py")  # a rank of either, not its torchrun
TASK = {"n_train": 65536, "n_val": 64, "dim": 256, "hidden": 1024, "classes": 16}
BATCH, RANKS, CLIP = 64, 2, 1.0
TICK = os.sysconf("SC_CLK_TCK")


# --- CPU time of everything this bench started -------------------------------------------------------
class CpuSampler:
    """Every `every` s: CPU ticks of each thread of this process and of its descendants."""

    def __init__(self, every: float = 0.5):
        self.every, self.samples = every, []  # [(time, {(pid, tid): ticks})]
        self.roles: dict[int, str] = {}  # pid -> role
        self.own_tid = 0
        self.counts: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        self.own_tid = threading.get_native_id()  # the sampler's own CPU is not counted
        while not self._stop.wait(self.every):
            self.samples.append((time.time(), self._read()))

    def _read(self) -> dict[tuple[int, int], int]:
        found = {}
        for pid in _descendants(os.getpid()) | {os.getpid()}:
            role = _role(pid)  # again each time: a child forked but not yet exec'd looks like its parent
            if role is not None:  # None: a zombie (no command line): it keeps what it was
                self.roles[pid] = role
            if self.roles.get(pid) == "rank":  # page faults and context switches of the whole process
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    pass
                else:
                    found[(pid, -1)] = int(fields[7])  # minflt
                    found[(pid, -2)] = sum(int(line.split()[1]) for line in status.splitlines()
                                           if line.endswith("ctxt_switches") or "ctxt_switches:" in line)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                if int(tid) == self.own_tid:
                    continue
                try:
                    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                found[(pid, int(tid))] = int(fields[11]) + int(fields[12])  # utime + stime
        return found

    def per_step(self, times: list[float]) -> dict[str, float]:
        """CPU ms per training step by part (rank main threads, rank other threads, launcher:
        torchrun / controller + agents, this bench process), between the first and the last CPU
        sample inside the steady window `times` (end-of-step wall times), so every process is alive
        at both ends; the steps counted are those that ended between the two samples."""
        inside = [s for s in self.samples if times[0] <= s[0] <= times[-1]]
        if len(inside) < 2:
            return {}
        (ta, before), (tb, after) = inside[0], inside[-1]
        steps = sum(ta < t <= tb for t in times)
        parts: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        for (pid, tid), ticks in after.items():
            if tid < 0:  # a counter, not CPU ticks
                counts["page faults" if tid == -1 else "context switches"] += ticks - before.get((pid, tid), 0)
                continue
            used = (ticks - before.get((pid, tid), 0)) / TICK
            role = self.roles.get(pid, "other")
            if role == "rank":
                parts["ranks: main threads" if pid == tid else "ranks: other threads"] += used
            else:
                parts[role] += used
        self.counts = {k: v / steps for k, v in sorted(counts.items())}  # per step, both ranks together
        return {k: 1000 * v / steps for k, v in sorted(parts.items())}


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _role(pid: int) -> str | None:
    if pid == os.getpid():
        return "bench (run.wait)"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if not cmd:
        return None
    if "workbench.engine.worker" in cmd or (any(n in cmd for n in HAND_LOOPS) and "torch.distributed.run" not in cmd):
        return "rank"
    return "launcher"


# --- the sides -----------------------------------------------------------------------------------
def steady(times: list[float], warmup: int) -> list[float]:
    """The steady window: rank 0's end-of-step wall times from the end of step `warmup` on."""
    return times[warmup - 1:]


def rate(window: list[float]) -> float:
    """Samples/s over the window (all ranks)."""
    return (len(window) - 1) * BATCH * RANKS / (window[-1] - window[0])


def hand(root: Path, steps: int, warmup: int, extra: list[str]) -> list[float]:
    found = hand_loop(root, ["--steps", str(steps), "--batch", str(BATCH), "--clip", str(CLIP),
                             *(f"--{k.replace('_', '-')}={v}" for k, v in TASK.items()), *extra])
    assert found["threads"] == 1, found
    return steady(found["times"], warmup)


def hand_loop(root: Path, args: list[str], nproc: int = RANKS, timeout: float = 1200,
              script: Path = HAND_LOOP) -> dict[str, Any]:
    """`torchrun --standalone` running `script` (hand_ddp_loop.py) with `args`: what its rank 0 wrote
    (the end-of-step wall times, ...).  1 thread per rank (torchrun's OMP_NUM_THREADS=1)."""
    out = root / f"hand-{time.time_ns()}.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torchrun sets it to 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script),
           "--out", str(out), *args]
    for attempt in (1, 2):  # torchrun's standalone rendezvous fails now and then on a busy machine
        done = run_group(cmd, timeout, env=env)
        if done.returncode == 0:
            break
        print(f"    torchrun failed (attempt {attempt}): {done.stderr.strip().splitlines()[-1:]}", flush=True)
    else:
        raise RuntimeError(f"torchrun failed twice; its last output:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def run_group(cmd: list[str], timeout: float, first: int = signal.SIGTERM, **popen: Any) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in a session of its own, so that a command
    still running after `timeout` s is ended with everything it started (`first`, then SIGKILL), not
    only its own process (subprocess.run's kill would leave torchrun's ranks training); then
    TimeoutExpired, with the output it had written."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            end([Proc(proc.pid, pgid=proc.pid)], first=first)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def config(root: Path, steps: int, dist: dict[str, Any] | None = None) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "synthetic", "options": TASK},
        "train": {"micro_batch_size": BATCH, "max_steps": steps, "epochs": 10**6, "lr": 1e-3, "grad_clip_norm": CLIP,
                  "log_every_steps": 1, "checkpoint_every_steps": 10**9},
        "dist": {"procs_per_node": RANKS, "threads_per_rank": 1, **(dist or {})},
        "launch": {"run_root": str(root / "runs"), "time_limit": "30"},
    })


def engine(root: Path, steps: int, warmup: int, code: str | None = None,
           dist: dict[str, Any] | None = None) -> list[float]:
    """workbench.submit + run.wait; with `code`, the launched processes (controller, agents,
    workers) import workbench from that folder (another checkout) instead; `dist`: settings of
    the config's dist section beside the bench's (e.g. {"strategy": "fsdp2"})."""
    saved = os.environ.get("PYTHONPATH")
    if code:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (code, saved) if p)
    try:
        run = workbench.submit(config(root, steps, dist))
    finally:
        if code:
            os.environ.pop("PYTHONPATH") if saved is None else os.environ.update(PYTHONPATH=saved)
    return steady(step_times(run, steps), warmup)


def step_times(run: workbench.Run, steps: int, timeout: float = 1200) -> list[float]:
    """Rank 0's end-of-step wall times of a run logging every step, once it has finished; a run
    still going after `timeout` s is cancelled (TimeoutError), one that ended otherwise raises."""
    try:
        status = run.wait(timeout=timeout)
    except TimeoutError:
        run.cancel(by="the bench: out of time")
        raise
    if status.state != "finished":
        raise RuntimeError(f"engine run {run.folder} ended {status.state}: {run.exception()}")
    frame = run.metrics()
    times = frame[frame["rank"] == 0].sort_values("step")["time"].tolist()
    assert len(times) == steps, (len(times), steps)
    return times


# --- rounds ------------------------------------------------------------------------------------------
def alternate(sides: dict[str, Callable[[Path], list[float]]], n_rounds: int) -> list[dict[str, Any]]:
    """`n_rounds` rounds of every side (each a function of a scratch folder returning its steady
    window), each side going first in turn, the CPU of everything started sampled; the first side
    is the baseline of the ratios.  Prints every round; returns their figures."""
    names = list(sides)
    base = names[0]
    rounds: list[dict[str, Any]] = []
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n_rounds):
            order = names[i % len(names):] + names[:i % len(names)]  # each side goes first in turn
            found: dict[str, Any] = {"load": os.getloadavg()[0]}
            for name in order:
                with CpuSampler() as cpu:
                    window = sides[name](Path(tmp))
                found[name] = {"samples_per_s": rate(window), "window_s": window[-1] - window[0],
                               "cpu_ms_per_step": cpu.per_step(window), "ranks_per_step": cpu.counts}
            for name in names[1:]:
                found[f"ratio {name}"] = found[name]["samples_per_s"] / found[base]["samples_per_s"]
            found["load_end"] = os.getloadavg()[0]
            rounds.append(found)
            print(f"round {i + 1} ({' then '.join(order)}; load {found['load']:.2f} -> {found['load_end']:.2f}): "
                  + ", ".join(f"{name} {found[name]['samples_per_s']:,.0f} samples/s ({found[name]['window_s']:.0f} s)"
                              for name in names) + ", "
                  + ", ".join(f"{name} / {base} {found[f'ratio {name}']:.3f}" for name in names[1:]), flush=True)
            for name in names:
                parts = found[name]["cpu_ms_per_step"]
                print(f"    {name:8s} CPU ms/step: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
                      + f"  (total {sum(parts.values()):.2f}); ranks per step: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in found[name]["ranks_per_step"].items()), flush=True)
    return rounds


def summarize(rounds: list[dict[str, Any]], names: list[str], target: float = 0.97,
              base_label: str = "hand-written (torchrun)") -> dict[str, float]:
    """Prints the medians (samples/s, CPU ms/step by part, ratios to the first side); returns the
    median ratio of each other side."""
    print("median samples/s: " + ", ".join(
        f"{name} {statistics.median(r[name]['samples_per_s'] for r in rounds):,.0f}" for name in names))
    for name in names:
        keys = sorted({k for r in rounds for k in r[name]["cpu_ms_per_step"]})
        print(f"median CPU ms/step {name:8s}: " + ", ".join(
            f"{k} {statistics.median(r[name]['cpu_ms_per_step'].get(k, 0.0) for r in rounds):.2f}" for k in keys))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    medians = {}
    for name in names[1:]:
        ratios = [r[f"ratio {name}"] for r in rounds]
        medians[name] = statistics.median(ratios)
        print(f"median ratio {name} / {base_label}: {medians[name]:.3f} over {len(rounds)} "
              f"rounds (rounds: {', '.join(f'{x:.3f}' for x in ratios)}; target >= {target})")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run (every side)")
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the steady window")
    parser.add_argument("--hand-args", default="", help="extra arguments for hand_ddp_loop.py, e.g. "
                        "'--bucket-cap-mb 25 --gradient-as-bucket-view' (default: DDP with torch's defaults)")
    parser.add_argument("--also-engine", metavar="CHECKOUT", help="a third side: the engine of another checkout "
                        "(its launched processes import workbench from CHECKOUT), e.g. the commit before a change")
    parser.add_argument("--steady-malloc", action="store_true", help="fixed glibc malloc thresholds for every "
                        "side (GLIBC_TUNABLES): no side pays page faults for memory malloc gave back")
    parser.add_argument("--json", help="write every round's figures here")
    args = parser.parse_args()
    if args.steady_malloc:
        os.environ["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456"
    sides: dict[str, Callable[[Path], list[float]]] = {
        "hand": lambda root: hand(root, args.steps, args.warmup, args.hand_args.split()),
        "engine": lambda root: engine(root, args.steps, args.warmup)}
    if args.also_engine:
        sides[f"engine@{Path(args.also_engine).name}"] = lambda root: engine(root, args.steps, args.warmup,
                                                                              args.also_engine)
    rounds = alternate(sides, args.rounds)
    summarize(rounds, list(sides))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
