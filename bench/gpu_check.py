"""The GPU check (issue 33): what workbench is only tested for on CPU, measured on this machine's GPUs
in one command of at most 8 minutes, for the few minutes a GPU machine is lent.  On that machine
(the repository's root, no internet, no submitit: its wheel travels in .whl/, which git ignores, so
the device run must carry it):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && PYTHONUNBUFFERED=1 python3 bench/gpu_check.py

Writes bench/gpu/latest.json (or --json PATH: "$OUT/latest.json" on a lent machine, so that it comes
back) after every section, so a check cut short keeps what it measured; prints a table at the end. Each
section runs in processes of its own with a time limit of its own (all of them within --budget-s); one
that fails records its error and the next one runs.

    device                    GPU names and memory, torch, CUDA, NCCL, Python
    engine_vs_hand            a charlm of GPT-2 small's shape (768 wide, 12 layers, 12 heads, 256
                              characters, 32 sequences a rank), bf16, a rank per GPU: steady-state steps/s
                              of the engine as users launch it (workbench.submit + run.wait) against the
                              hand-written DDP loop (hand_ddp_loop.py) under torchrun, in alternating
                              rounds as bench/engine_throughput.py does on CPU; the median ratio
                              `engine_vs_hand` (goal >= 0.97)
    precision                 the engine's bf16 (engine_vs_hand's runs) and fp16 with its GradScaler
    fsdp2_vs_ddp              the same model under torch's fully_shard (each block, then the root) and
                              under DDP: per-step losses, peak memory a rank, steps/s.  Hand-written loops
                              while the engine has no dist.strategy fsdp2 (issue 32), the engine once it has
    planned_vs_measured_peak  the predicted peak memory of a training step against CUDA's
                              max_memory_allocated of the same step, for three models.  workbench.plan
                              predicts once it exists (issue 31); until then the estimator it is specified
                              to use: torch's MemTracker tracing the step on fake tensors
    failures                  (2 GPUs or more) a rank raising and a rank hung over NCCL: named as on CPU?
    gpu_tests                 `pytest tests/ddp/test_gpu.py -m gpu`: passed, failed, skipped

--cpu-smoke --json PATH runs the same plumbing on CPU (gloo, tiny models, a few steps, fp32 in place of
fp16, the estimator against the same tracker on real tensors; 3 minutes on the shared 2-core machine at
load average 5): tests/ddp/test_gpu_check_smoke.py runs it, so the check is known to work before a GPU
is ever lent.
"""  # noqa: E501 - the command above is one line, to be copied whole

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_throughput import hand_loop, run_group, steady, step_times

import workbench
from workbench.config import ConfigError, JobConfig
from workbench.runfolder.layout import read_json

ROOT = Path(__file__).resolve().parents[1]
LATEST = ROOT / "bench" / "gpu" / "latest.json"
GOAL = 0.97
MIN_SECTION_S = 15.0
"""A section with less time than this left in the check's budget is skipped, not started."""
FAULT_STEP = 10
"""The failure runs' rank 1 raises or hangs in its loss at this step."""
HANG_NAMED_S = 30.0
"""The hung run, started beside the raising one, has this long after that one ended to be named and
end (its 3 s stall limit, a heartbeat or two, its peers stopping: about 10 s on CPU)."""


@dataclasses.dataclass(frozen=True)
class PeakModel:
    name: str
    task: str  # a built-in task, built by its factory as a rank would
    options: dict[str, Any]
    batch: int
    precision: str


@dataclasses.dataclass(frozen=True)
class Shape:
    """What differs between the GPU check and its CPU smoke run."""

    lm: dict[str, int]  # the throughput model: options of the built-in charlm
    batch: int  # sequences a rank a step
    steps: int  # steps a run
    warmup: int  # first steps left out of the steady window
    rounds: int  # engine / hand rounds at most (fewer when the section's time runs short)
    losses: int  # per-step losses compared between fsdp2 and ddp
    second_precision: str  # fp16 on a GPU; fp32 on CPU, where the engine refuses fp16 (its GradScaler needs CUDA)
    budget_s: float  # the whole check
    limits: dict[str, float]  # each section's own
    peak_models: tuple[PeakModel, ...]


GPU = Shape(
    lm={"block_size": 256, "d_model": 768, "n_head": 12, "n_layer": 12}, batch=32, steps=300, warmup=50,
    rounds=4, losses=20, second_precision="fp16", budget_s=450,  # a round is about 45 s on one H200
    limits={"device": 60, "gpu_tests": 200, "engine_vs_hand": 220, "precision": 60, "fsdp2_vs_ddp": 75,
            "planned_vs_measured_peak": 75, "failures": 90},
    peak_models=(
        PeakModel("mlp 1024-8192-1024", "synthetic", {"dim": 1024, "hidden": 8192, "classes": 1024,
                                                      "n_train": 2048, "n_val": 8}, 2048, "fp32"),
        PeakModel("charlm d256 x4", "charlm", {"block_size": 256, "d_model": 256, "n_head": 4, "n_layer": 4},
                  32, "fp32"),
        PeakModel("charlm d1024 x8 bf16", "charlm", {"block_size": 256, "d_model": 1024, "n_head": 16,
                                                     "n_layer": 8}, 16, "bf16")))
SMOKE = Shape(
    lm={"block_size": 32, "d_model": 32, "n_head": 2, "n_layer": 2}, batch=8, steps=20, warmup=5,
    rounds=1, losses=10, second_precision="fp32", budget_s=420,
    limits={"device": 60, "gpu_tests": 90, "engine_vs_hand": 120, "precision": 90, "fsdp2_vs_ddp": 120,
            "planned_vs_measured_peak": 90, "failures": 120},
    peak_models=(
        PeakModel("mlp 32-256-8", "synthetic", {"dim": 32, "hidden": 256, "classes": 8, "n_train": 256,
                                                "n_val": 8}, 64, "fp32"),
        PeakModel("charlm d16 x1", "charlm", {"block_size": 32, "d_model": 16, "n_head": 2, "n_layer": 1}, 8,
                  "fp32"),
        PeakModel("charlm d32 x2", "charlm", {"block_size": 32, "d_model": 32, "n_head": 2, "n_layer": 2}, 8,
                  "fp32")))


class Check:
    """The report being written, the time left, and what every section needs to know."""

    def __init__(self, shape: Shape, smoke: bool, work: Path, out: Path):
        self.shape, self.smoke, self.work, self.out = shape, smoke, work, out
        self.started = time.monotonic()
        self.gpus = 0
        self.report: dict[str, Any] = {"mode": "cpu-smoke" if smoke else "gpu", "command": sys.argv,
                                       "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "seconds": 0.0, "runs": []}

    @property
    def nproc(self) -> int:
        """Ranks of the throughput runs: one per GPU, at most 8; one on CPU."""
        return min(self.gpus, 8) or 1

    def say(self, text: str) -> None:
        print(f"[gpu_check {time.monotonic() - self.started:5.0f} s] {text}", flush=True)

    def section(self, name: str, run: Callable[[Check, Path, float], dict[str, Any]]) -> None:
        """Run one section within its limit (and the check's budget), record what it found or its
        error, stop whatever it left running, and write the report so far."""
        limit = min(self.shape.limits[name], self.shape.budget_s - (time.monotonic() - self.started))
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        if limit < MIN_SECTION_S:
            found: dict[str, Any] = {"ok": False, "skip": f"out of time ({self.shape.budget_s:.0f} s budget)"}
        else:
            self.say(f"{name}: started ({limit:.0f} s at most)")
            try:
                found = {"ok": True, **run(self, folder, began + limit)}
            except Exception as exc:  # noqa: BLE001 - a section's failure is its finding; the others still run
                found = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "traceback": traceback.format_exc()[-4000:]}
        found["seconds"] = round(time.monotonic() - began, 1)
        left = _stop_leftovers(folder)
        if left:
            found["left_running"] = left
        self.report[name] = found
        self.write()
        self.say(f"{name}: {describe(name, found)}")

    def submit(self, cfg: JobConfig) -> workbench.Run:
        """workbench.submit, as users launch runs; the report lists every run's folder."""
        run = workbench.submit(cfg)
        self.report["runs"].append(str(run.folder))
        return run

    def write(self) -> None:
        self.report["seconds"] = round(time.monotonic() - self.started, 1)
        # whether each run's ranks were forked warm (workbench/engine/forked.py): on CUDA, the guard falls
        # back to fresh ranks if importing torch touched the driver; this says which happened
        self.report["ranks_forked"] = {run: [bool((read_json(path) or {}).get("forked"))
                                             for path in sorted((Path(run) / "procs").glob("rank*.json"))]
                                       for run in self.report["runs"]}
        self.out.parent.mkdir(parents=True, exist_ok=True)
        temp = self.out.with_name(f".{self.out.name}.{os.getpid()}")
        temp.write_text(json.dumps(self.report, indent=1) + "\n")
        os.replace(temp, self.out)  # a reader never sees half a report


def _stop_leftovers(folder: Path) -> list[str]:
    """What a section left running (nothing, unless it ran out of time): every process whose command
    line names its folder, stopped the way the test suite stops a failed test's leftovers."""
    from tests.support.leftovers import stop_what_is_left

    return stop_what_is_left(folder, [])


def remaining(until: float) -> float:
    return max(1.0, until - time.monotonic())


def steps_per_s(window: list[float]) -> float:
    """Steady-state steps/s of rank 0's end-of-step wall times."""
    return (len(window) - 1) / (window[-1] - window[0])


# --- sections --------------------------------------------------------------------------------------------
def gpu_tests(check: Check, folder: Path, until: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "tests/ddp/test_gpu.py", "-m", "gpu", "-n", "0", "-p", "no:cacheprovider",
           "-q", f"--basetemp={folder / 'tmp'}"]
    limit, error = remaining(until), None
    try:  # out of time: SIGINT first, so that pytest still prints its counts
        done = run_group(cmd, limit, first=signal.SIGINT, cwd=ROOT)
        out, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as exc:
        out, code, error = exc.stdout or "", None, f"pytest still running after {limit:.0f} s: stopped"
    if code not in (None, 0, 1, 5):  # 1: tests failed (a finding), 5: none collected; else pytest itself failed
        error = f"pytest exited {code}"
    lines = [line.strip("= ") for line in out.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", last):
        counts["errors" if word.startswith("error") else word] = int(number)
    found = {**counts, "summary": last, "exit_code": code,
             "failed_tests": [line for line in lines if line.startswith(("FAILED", "ERROR"))]}
    if error or code != 0:
        found.update(output_tail=out[-6000:])
    if error:
        found.update(ok=False, error=error)
    return found


def lm_config(check: Check, folder: Path, precision: str, **dist: Any) -> JobConfig:
    """The throughput job as the engine runs it: the same model, data, optimizer and clipping as the
    hand loop's arguments below, a record every step, no eval or checkpoint inside the window."""
    s = check.shape
    return JobConfig.from_dict({
        "task": {"name": "charlm", "options": s.lm},
        "train": {"micro_batch_size": s.batch, "max_steps": s.steps, "epochs": 10**6, "lr": 1e-3,
                  "grad_clip_norm": 1.0, "precision": precision, "log_every_steps": 1,
                  "checkpoint_every_steps": 10**9, "eval_every_steps": 10**9},
        "dist": {"procs_per_node": check.nproc, "threads_per_rank": 1, **dist},
        "launch": {"run_root": str(folder / "runs"), "time_limit": "30"},
    })


def hand_args(check: Check, precision: str, *extra: str) -> list[str]:
    s = check.shape
    return ["--task", "charlm", *(f"--{k.replace('_', '-')}={v}" for k, v in s.lm.items()), "--steps", str(s.steps),
            "--batch", str(s.batch), "--clip", "1.0", "--precision", precision, *extra]


def engine_run(check: Check, folder: Path, precision: str, until: float, **dist: Any) -> dict[str, Any]:
    """One engine run: its steady steps/s, rank 0's first losses and peak memory (the engine's mem_mb)."""
    run = check.submit(lm_config(check, folder, precision, **dist))
    times = step_times(run, check.shape.steps, remaining(until))
    rank0 = run.metrics().query("rank == 0").sort_values("step")
    return {"steps_per_s": steps_per_s(steady(times, check.shape.warmup)), "peak_mb": float(rank0["mem_mb"].max()),
            "losses": rank0["loss"].head(check.shape.losses).tolist(), "run": str(run.folder)}


def hand_run(check: Check, folder: Path, precision: str, until: float, *extra: str) -> dict[str, Any]:
    found = hand_loop(folder, hand_args(check, precision, *extra), nproc=check.nproc, timeout=remaining(until))
    return {"steps_per_s": steps_per_s(steady(found["times"], check.shape.warmup)), "peak_mb": found["peak_mb"],
            "losses": found["losses"], "device": found["device"], "backend": found["backend"]}


def engine_vs_hand(check: Check, folder: Path, until: float) -> dict[str, Any]:
    sides = {"hand": lambda: hand_run(check, folder, "bf16", until),
             "engine": lambda: engine_run(check, folder, "bf16", until)}
    rounds: list[dict[str, Any]] = []
    for i in range(check.shape.rounds):
        if rounds and remaining(until) < 1.3 * rounds[-1]["seconds"]:
            break  # another round would not end in time
        began, order = time.monotonic(), ["hand", "engine"][::1 if i % 2 == 0 else -1]  # each side first in turn
        rates = {side: sides[side]()["steps_per_s"] for side in order}
        rounds.append({"order": order, **{f"{side}_steps_per_s": rates[side] for side in sides},
                       "ratio": rates["engine"] / rates["hand"], "seconds": round(time.monotonic() - began, 1)})
        check.say(f"  round {i + 1}: hand {rates['hand']:.2f}, engine {rates['engine']:.2f} steps/s, "
                  f"engine / hand {rounds[-1]['ratio']:.3f}")
    ratio = statistics.median(r["ratio"] for r in rounds)
    return {"what": "engine (workbench.submit + run.wait) vs hand-written DDP loop (bench/hand_ddp_loop.py) under "
                    "torchrun --standalone; steady-state steps/s of rank 0, median of alternating rounds",
            "model": {"task": "charlm", **check.shape.lm, "micro_batch_size": check.shape.batch}, "precision": "bf16",
            "ranks": check.nproc, "steps": check.shape.steps, "warmup": check.shape.warmup, "rounds": rounds,
            "hand_steps_per_s": statistics.median(r["hand_steps_per_s"] for r in rounds),
            "engine_steps_per_s": statistics.median(r["engine_steps_per_s"] for r in rounds),
            "engine_vs_hand": ratio, "goal": GOAL, "met": ratio >= GOAL}


def precision(check: Check, folder: Path, until: float) -> dict[str, Any]:
    bf16 = check.report.get("engine_vs_hand", {}).get("engine_steps_per_s")
    found = {"bf16_steps_per_s": bf16 or engine_run(check, folder, "bf16", until)["steps_per_s"],
             "bf16_from": "engine_vs_hand's engine runs" if bf16 else "its own run"}
    second = check.shape.second_precision
    found[f"{second}_steps_per_s"] = engine_run(check, folder, second, until)["steps_per_s"]
    if second != "fp16":
        found["note"] = "CPU: fp32 in place of fp16 (train.precision fp16 needs CUDA's GradScaler)"
    return found


def fsdp2_vs_ddp(check: Check, folder: Path, until: float) -> dict[str, Any]:
    try:
        lm_config(check, folder, "bf16", strategy="fsdp2")
        built = True
    except ConfigError:  # no dist.strategy yet (issue 32)
        built = False
    losses = ["--losses", str(check.shape.losses)]
    sides = {strategy: (engine_run(check, folder, "bf16", until, strategy=strategy) if built
                        else hand_run(check, folder, "bf16", until, "--strategy", strategy, *losses))
             for strategy in ("ddp", "fsdp2")}
    ddp, fsdp2 = sides["ddp"], sides["fsdp2"]
    return {"what": ("the engine: dist.strategy ddp vs fsdp2, train.precision bf16" if built else
                     "HAND-WRITTEN LOOPS (bench/hand_ddp_loop.py --strategy ddp|fsdp2 under torchrun), because the "
                     "engine has no fsdp2 strategy yet (issue 32): fully_shard on each block, then the root; bf16 "
                     "autocast on both sides (fp32 parameters)"),
            "memory": "CPU peak RSS of rank 0 (not comparable)" if check.smoke else "max_memory_allocated, rank 0",
            "ranks": check.nproc, **sides, "steps_per_s_ratio": fsdp2["steps_per_s"] / ddp["steps_per_s"],
            "peak_mb_ratio": fsdp2["peak_mb"] / ddp["peak_mb"],
            "loss_max_abs_diff": max(abs(a - b) for a, b in zip(ddp["losses"], fsdp2["losses"]))}


def planned_vs_measured_peak(check: Check, folder: Path, until: float) -> dict[str, Any]:
    """In a fresh interpreter: its own CUDA context and allocator statistics."""
    return worker(check, "peaks", folder, until)


def failures(check: Check, folder: Path, until: float) -> dict[str, Any]:
    """Rank 1 raises, or hangs in its loss, at step FAULT_STEP (tests/ddp/test_failure_causes.py's faults),
    the two runs side by side; named as on CPU: the cause is rank 1, with its error, or Hung while rank
    0 waits for it in a collective."""
    if not check.smoke and check.gpus < 2:
        return {"skip": f"{check.gpus} GPU"}
    runs = {how: check.submit(failing_config(folder, how)) for how in ("raise", "hang")}
    began = time.monotonic()
    try:
        found = {"raise": failure_named("raise", runs["raise"], began, remaining(until))}
        found["hang"] = failure_named("hang", runs["hang"], began, min(remaining(until), HANG_NAMED_S))
        return found
    finally:
        for run in runs.values():
            run.cancel(by="gpu_check: the section ended")  # nothing to do for a run that has ended


def failing_config(folder: Path, how: str) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": "tests.support.tasks_for_tests:failing_at",
                 "options": {"step_calls": FAULT_STEP, "how": how, "n_train": 4096, "n_val": 64, "hidden": 256}},
        "train": {"micro_batch_size": 64, "epochs": 10**6, "max_steps": 10**9, "checkpoint_every_steps": 10**9,
                  "eval_every_steps": 10**9},
        "dist": {"procs_per_node": 2, "threads_per_rank": 1, "timeout_s": 120, "stall_after_s": 3},
        "launch": {"run_root": str(folder / how), "time_limit": "10"},
    })


def failure_named(how: str, run: workbench.Run, began: float, wait_s: float) -> dict[str, Any]:
    try:
        status = run.wait(timeout=wait_s)
    except TimeoutError as exc:
        reached = run.status().step
        run.cancel(by="gpu_check: not ended in time")
        if reached < FAULT_STEP - 1:  # out of time before the fault: nothing was shown
            raise TimeoutError(f"the {how} run was at step {reached} of the {FAULT_STEP - 1} before its fault") from exc
        # past its fault and still running: not named, and what it was doing is the finding
        return {"state": "running", "named": False, "cause": None, "run": str(run.folder), "seconds_to_end": None,
                "note": f"still running after {wait_s:.0f} s of waiting: {str(exc).split(': ', 1)[-1]}"}
    cause = run.exception(status)
    if how == "raise":
        named = cause is not None and cause.rank == 1 and "injected failure on rank 1" in cause.traceback
    else:
        named = (cause is not None and (cause.rank, cause.type) == (1, "Hung")
                 and "rank 0 waits for it in a collective" in cause.message)
    return {"state": status.state, "named": named, "cause": cause.summary() if cause else None,
            "seconds_to_end": round(time.monotonic() - began, 1), "run": str(run.folder)}


SECTIONS: dict[str, Callable[[Check, Path, float], dict[str, Any]]] = {
    "engine_vs_hand": engine_vs_hand, "precision": precision, "fsdp2_vs_ddp": fsdp2_vs_ddp,
    "planned_vs_measured_peak": planned_vs_measured_peak, "failures": failures, "gpu_tests": gpu_tests}
"""In the order they run: the figures first, then the tests, whose time is the hardest to foresee (a test
that hangs costs its own section, not the figures')."""


# --- workers: the parts that touch the device, each in a fresh interpreter -----------------------------
def worker(check: Check, part: str, folder: Path, until: float) -> dict[str, Any]:
    out = folder / f"{part}.json"
    cmd = [sys.executable, __file__, "--worker", part, "--json", str(out), *(["--cpu-smoke"] if check.smoke else [])]
    done = run_group(cmd, remaining(until), cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the {part} worker exited {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(out.read_text())


def device_worker() -> dict[str, Any]:
    import torch

    from workbench.engine.rank import runtime_versions

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = [torch.cuda.get_device_properties(i) for i in range(gpus)]
    return {**runtime_versions(torch), "gpus": gpus, "names": [p.name for p in props],
            "memory_gib": [round(p.total_memory / 2**30, 1) for p in props],
            "bf16": bool(gpus and torch.cuda.is_bf16_supported())}


ESTIMATOR = ("the estimator workbench.plan is specified to use (issue 31; workbench.plan is not built yet): "
             "torch.distributed._tools.mem_tracker.MemTracker tracing the models' own factories and two "
             "training steps (forward, backward, clipping, AdamW) on fake tensors, nothing allocated")


def peaks_worker(shape: Shape) -> dict[str, Any]:
    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    planned = hasattr(workbench, "plan")
    models = []
    for spec in shape.peak_models:
        began = time.perf_counter()
        predicted = plan_peak(spec) if planned else traced_peak(spec, device, fake=True)
        predict_s = time.perf_counter() - began
        measured = cuda_peak(spec, device) if device != "cpu" else traced_peak(spec, device, fake=False)
        models.append({"model": spec.name, "micro_batch_size": spec.batch, "precision": spec.precision,
                       "predicted_mb": predicted / 2**20, "measured_mb": measured / 2**20,
                       "measured_over_predicted": measured / predicted, "predict_s": round(predict_s, 2)})
    return {"predicted_by": "workbench.plan(cfg, world_sizes=(1,))" if planned else ESTIMATOR,
            "measured_by": ("the same tracker on real tensors: CPU keeps no allocator statistics" if device == "cpu"
                            else "torch.cuda.max_memory_allocated over the same two steps, a fresh process"),
            "device": device, "models": models}


def plan_peak(spec: PeakModel) -> float:
    cfg = JobConfig.from_dict({"task": {"name": spec.task, "options": spec.options},
                               "train": {"micro_batch_size": spec.batch, "precision": spec.precision},
                               "dist": {"procs_per_node": 1}})
    return float(workbench.plan(cfg, world_sizes=(1,), probe=False)["peak_mb"].iloc[0]) * 2**20


def _built(spec: PeakModel, device: str, fake: Any = None) -> tuple[Any, Any, Any, Any]:
    """The task from its factory (in FakeTensorMode `fake`, if given), its model on `device`, AdamW,
    one micro-batch of the configured shape."""

    import torch
    from torch.utils.data import default_collate

    from workbench.engine.data import to_device
    from workbench.engine.tasks import build_task, resolve_factory
    from workbench.planning.memory import moved

    torch.manual_seed(0)
    # Not FakeCopyMode: it maps nn.TransformerEncoder's clones of its layer back to that one layer
    task = build_task(resolve_factory(spec.task), spec.options)
    model = moved(task.model, device) if fake else task.model.to(device)
    # foreach: torch's own choice for real CUDA parameters (its multi-tensor step, with temporaries the size
    # of all parameters); it cannot see that fake ones stand for CUDA tensors and would take the per-tensor step
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=device.startswith("cuda"))
    batch = to_device(default_collate([task.train_dataset[i] for i in range(spec.batch)]), device)
    return task, model, optimizer, batch


def _two_steps(spec: PeakModel, device: str, built: tuple[Any, Any, Any, Any], after_step: Callable[[], None]) -> None:
    """Two training steps as the engine's Trainer takes them (the second one with the optimizer's state)."""
    import torch

    from workbench.engine.tasks import forward_loss

    task, model, optimizer, batch = built
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.precision)
    for _ in range(2):
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype is not None):
            loss = forward_loss(model, batch, task.loss_fn)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after_step()


def traced_peak(spec: PeakModel, device: str, fake: bool) -> float:
    """MemTracker's peak bytes of the two steps on `device`, on fake tensors (nothing allocated) or real ones."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    mode = FakeTensorMode() if fake else None
    with mode or contextlib.nullcontext():
        built = _built(spec, device, mode)
        tracker = MemTracker()
        tracker.track_external(*built[1:])
        with tracker:
            _two_steps(spec, device, built, tracker.reset_mod_stats)  # it refuses a module's second forward otherwise
    return float(sum(snap["Total"] for dev, snap in tracker.get_tracker_snapshot("peak").items()
                     if dev.type == device.split(":")[0]))


def cuda_peak(spec: PeakModel, device: str) -> float:
    """CUDA's max_memory_allocated over the same two steps: the model, its optimizer and batch, then the steps."""
    import gc

    import torch

    built = _built(spec, device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    _two_steps(spec, device, built, lambda: None)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del built
    gc.collect()
    torch.cuda.empty_cache()
    return float(peak)


# --- the table --------------------------------------------------------------------------------------------
def describe(name: str, found: dict[str, Any]) -> str:
    """A section's figures in one line (the table's and the progress line's)."""
    if "skip" in found:
        return f"skipped: {found['skip']}"
    if "error" in found and name != "gpu_tests":
        return f"FAILED: {found['error'].splitlines()[0][:200]}"
    return DESCRIBE[name](found)


def _device(f: dict[str, Any]) -> str:
    gpus = ", ".join(f"{n} ({m} GiB)" for n, m in zip(f["names"], f["memory_gib"])) or "no GPU"
    return f"{gpus}; torch {f['torch']}, CUDA {f['cuda']}, NCCL {f['nccl']}, Python {f['python']}"


def _tests(f: dict[str, Any]) -> str:
    said = f"{f['passed']} passed, {f['failed']} failed, {f['skipped']} skipped, {f['errors']} errors"
    return said + (f" -- {f['error']}" if "error" in f else "") + "".join(f"; {t}" for t in f["failed_tests"])


def _throughput(f: dict[str, Any]) -> str:
    return (f"engine {f['engine_steps_per_s']:.2f} vs hand {f['hand_steps_per_s']:.2f} steps/s, "
            f"engine_vs_hand {f['engine_vs_hand']:.3f} ({'met' if f['met'] else 'MISSED'}: goal >= {GOAL}; "
            f"{f['ranks']} rank(s), {len(f['rounds'])} round(s))")


def _precision(f: dict[str, Any]) -> str:
    return ", ".join(f"{k.split('_')[0]} {v:.2f} steps/s" for k, v in f.items() if k.endswith("_steps_per_s"))


def _fsdp2(f: dict[str, Any]) -> str:
    label = "hand-written loops" if f["what"].startswith("HAND") else "engine"
    return (f"{label}: steps/s fsdp2 {f['fsdp2']['steps_per_s']:.2f} / ddp {f['ddp']['steps_per_s']:.2f} = "
            f"{f['steps_per_s_ratio']:.3f}; peak MB {f['fsdp2']['peak_mb']:.0f} / {f['ddp']['peak_mb']:.0f}; "
            f"losses max |diff| {f['loss_max_abs_diff']:.2e}")


def _peaks(f: dict[str, Any]) -> str:
    label = "plan" if f["predicted_by"].startswith("workbench.plan") else "estimator"
    return f"{label}: " + "; ".join(f"{m['model']} {m['predicted_mb']:.4g} -> {m['measured_mb']:.4g} MB "
                                    f"(x{m['measured_over_predicted']:.3f})" for m in f["models"])


def _failures(f: dict[str, Any]) -> str:
    said = []
    for how in ("raise", "hang"):
        case = f[how]
        why = (case["cause"] or case.get("note") or "-").splitlines()[0][:150]
        said.append(f"{how}: {'named' if case['named'] else 'NOT NAMED'} ({case['seconds_to_end']} s; {why})")
    return " | ".join(said)


DESCRIBE: dict[str, Callable[[dict[str, Any]], str]] = {
    "device": _device, "gpu_tests": _tests, "engine_vs_hand": _throughput, "precision": _precision,
    "fsdp2_vs_ddp": _fsdp2, "planned_vs_measured_peak": _peaks, "failures": _failures}


def table(report: dict[str, Any]) -> str:
    rows = [(name, report[name]) for name in ("device", *SECTIONS) if name in report]
    return "\n".join(f"{name:<25} {'ok' if found.get('ok') else '--'}  {describe(name, found)}"
                     for name, found in rows)


# --- main -------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="the plumbing on CPU (needs --json)")
    parser.add_argument("--json", type=Path, help=f"where the report goes (default {LATEST.relative_to(ROOT)})")
    parser.add_argument("--work", type=Path, help="the runs' and loops' files (default: a temporary folder, removed)")
    parser.add_argument("--budget-s", type=float, help="the whole check's time (default 450; 420 with --cpu-smoke)")
    parser.add_argument("--worker", choices=("device", "peaks"), help=argparse.SUPPRESS)  # a section's own process
    args = parser.parse_args()
    shape = SMOKE if args.cpu_smoke else GPU
    if args.budget_s:
        shape = dataclasses.replace(shape, budget_s=args.budget_s)
    if args.cpu_smoke:
        if args.json is None:
            parser.error("--cpu-smoke writes its report only where --json says (never over the GPU figures)")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU, even on a GPU machine
    if args.worker:
        found = device_worker() if args.worker == "device" else peaks_worker(shape)
        args.json.write_text(json.dumps(found))
        return
    sys.path.insert(0, str(ROOT))  # tests.support, whose leftover stop and failing task the check uses
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(shape, args.cpu_smoke, work, args.json or LATEST)
    try:
        run_all(check)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def run_all(check: Check) -> None:
    check.say(f"{check.report['mode']} check: report {check.out}, work {check.work}, "
              f"{check.shape.budget_s:.0f} s budget")
    check.gpus = device_header(check)["gpus"]
    for name, section in SECTIONS.items():
        check.section(name, section)
    check.say(f"done in {time.monotonic() - check.started:.0f} s; report: {check.out}")
    print(table(check.report), flush=True)


def device_header(check: Check) -> dict[str, Any]:
    """The device, asked in a fresh interpreter (this process never touches CUDA: the ranks and loops
    own the GPUs).  Without a GPU the GPU check stops here, before writing over the last report."""
    found = worker(check, "device", check.work, time.monotonic() + check.shape.limits["device"])
    if not check.smoke and found["gpus"] == 0:
        sys.exit("gpu_check: no CUDA GPU visible here; on CPU run it with --cpu-smoke --json PATH")
    check.report["device"] = {"ok": True, **found}
    check.say(f"device: {_device(found)}")
    return found


if __name__ == "__main__":
    main()
