"""workbench.plan against what runs measure: predicted vs measured peak memory a rank and step time.

    python bench/plan_bench.py [--steps 40] [--json PATH] [--models A,B] [--cases "ddp x2,fsdp2 x2 accum 2"]
                                           (from the repository root; about 15 min here for all of them)

Four models at micro-batch 16: the built-in MLP (synthetic) and transformer (charlm), a conv net and a
Hugging Face GPT-2 (transformers, the engine's dict batches), under ddp at 1 and 2 ranks and fsdp2 at 2,
and both at 2 ranks with gradient accumulation 2 (gloo, 1 thread a rank).  Predicted:
`workbench.plan(cfg, world_sizes=(n,), strategies=(s,))` (memory traced on fake tensors; step time the
engine's step of the model measured with the row's ranks stepping at once on this host,
planning.probe.measured_step, rank 0's median after 5 warm-up steps).  Measured: what each real
`workbench.submit` run measured itself, read by `run.plan()` as a user would (rank 0's): its peak over
its first two steps (CPU keeps no allocator statistics: torch's MemTracker on the real tensors under ddp,
FSDPMemTracker under fsdp2; engine.memprobe) and its median step_time_s after the first 5 steps; the
prediction is the run's own plan, computed right after it.  Then the 1.34 B-parameter plan: its time and
how much the process grew.  The load average is printed with every row (other processes share this
machine).  Goals (issue 31): memory within 10%, step time within 30%."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import workbench  # noqa: E402
from workbench.config import JobConfig  # noqa: E402

MODELS = {
    "mlp 256-2048": ("synthetic", {"dim": 256, "hidden": 2048, "classes": 16, "n_train": 4096, "n_val": 64}),
    "charlm d128 x2": ("charlm", {"block_size": 64, "d_model": 128, "n_head": 4, "n_layer": 2}),
    "convnet 3x32x32": ("tests.support.tasks_for_tests:conv_net", {"n_train": 2048}),
    "hf gpt2 d128 x2": ("bench.plan_bench:gpt2", {}),
}


class _Tokens:
    """input_ids and labels of random token blocks, as a Hugging Face causal LM takes them."""

    def __init__(self, n: int, block: int, vocab: int):
        import torch

        self.ids = torch.randint(0, vocab, (n, block), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt2(n_train: int = 2048, block: int = 64) -> Any:
    """transformers' GPT2LMHeadModel, 2 layers of width 128, a vocabulary of 1000: the loss is its own."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from workbench.engine.tasks import Task

    config = GPT2Config(vocab_size=1000, n_positions=block, n_embd=128, n_layer=2, n_head=4, bos_token_id=0,
                        eos_token_id=0)
    return Task(model=GPT2LMHeadModel(config), train_dataset=_Tokens(n_train, block, 1000),
                val_dataset=_Tokens(32, block, 1000))


CASES = {"ddp x1": ("ddp", 1, 1), "ddp x2": ("ddp", 2, 1), "fsdp2 x2": ("fsdp2", 2, 1),
         "ddp x2 accum 2": ("ddp", 2, 2), "fsdp2 x2 accum 2": ("fsdp2", 2, 2)}
"""Name -> (strategy, world size, grad_accum_steps)."""


def _cfg(task: str, options: dict[str, Any], world: int, steps: int, root: Path, strategy: str = "ddp",
         accum: int = 1) -> JobConfig:
    return JobConfig.from_dict({
        "task": {"name": task, "options": options},
        "train": {"micro_batch_size": 16, "grad_accum_steps": accum, "max_steps": steps, "eval_every_steps": 10_000,
                  "checkpoint_every_steps": 10_000, "log_every_steps": 1},
        "dist": {"procs_per_node": world, "threads_per_rank": 1, "check_every_steps": None, "strategy": strategy},
        "launch": {"run_root": str(root)}})


BILLION = """
import json, resource, time
import workbench
from workbench.config import JobConfig
cfg = JobConfig.from_dict({"task": {"name": "tests.support.tasks_for_tests:billion"}, "train": {"micro_batch_size": 4},
                           "dist": {"procs_per_node": 1}})
import torch, workbench.planning.memory, torch.distributed._tools.mem_tracker  # what the plan imports, before
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.perf_counter()
frame = workbench.plan(cfg, world_sizes=(1, 8), probe=False)
print(json.dumps({"plan_s": round(time.perf_counter() - began, 2), "params_mb": float(frame["params_mb"].iloc[0]),
                  "peak_mb": float(frame["peak_mb"].iloc[0]),
                  "grown_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def billion_plan() -> dict[str, Any]:
    """The 1.34 B-parameter plan in a fresh process: its time, and how much its peak memory grew over the
    imports (ru_maxrss after them, and after the plan)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", BILLION], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _case(name: str, strategy: str, world: int, steps: int, root: Path, accum: int = 1) -> dict[str, Any]:
    """One row: a real `workbench.submit` run, then `run.plan()` on it, as a user checks a run: the plan's
    prediction for the run (its step probe right after the run) next to what the run's ranks measured."""
    task, options = MODELS[name]
    cfg = _cfg(task, options, world, steps, root, strategy, accum)
    run = workbench.submit(cfg)
    status = run.wait(timeout=900)
    if status.state != "finished":
        raise RuntimeError(f"{cfg.task.name}: the run {status.state}: {run.exception()}")
    load = os.getloadavg()[0]
    began = time.perf_counter()
    check = run.plan()
    plan_s = time.perf_counter() - began
    row = check.iloc[0]  # rank 0
    how = run.event_summary().memory.get(0, {}).get("how")
    return {"model": name, "strategy": strategy, "world_size": world, "grad_accum_steps": accum,
            "predicted_peak_mb": row["predicted_peak_mb"],
            "measured_peak_mb": row["measured_peak_mb"],
            "peak_ratio": row["measured_peak_mb"] / row["predicted_peak_mb"],
            "measured_by": how, "predicted_step_s": row["predicted_step_s"], "measured_step_s": row["measured_step_s"],
            "step_ratio": row["measured_step_s"] / row["predicted_step_s"], "plan_s": round(plan_s, 2),
            "load": round(load, 2), "misses": check.attrs["misses"], "notes": check.attrs["notes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names of MODELS")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names of CASES")
    args = parser.parse_args()
    import torch

    rows = []
    started, load_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for case in args.cases.split(","):
                strategy, world, accum = CASES[case]
                rows.append(r := _case(name, strategy, world, args.steps, Path(tmp), accum))
                print(f"{name:>16} {case:>16}: peak {r['predicted_peak_mb']:8.2f} planned, "
                      f"{r['measured_peak_mb']:8.2f} measured (x{r['peak_ratio']:.3f}); step "
                      f"{r['predicted_step_s'] * 1000:7.2f} ms planned, {r['measured_step_s'] * 1000:7.2f} ms measured "
                      f"(x{r['step_ratio']:.2f}); plan {r['plan_s']:.1f} s; load {r['load']:.1f}", flush=True)
        billion = billion_plan()
    print(f"1.34 B parameters: planned in {billion['plan_s']} s, peak {billion['peak_mb']:,.0f} MiB a rank, the "
          f"process grew {billion['grown_mb']:.0f} MiB")
    worst_peak = max(abs(r["peak_ratio"] - 1) for r in rows)
    worst_step = max(abs(r["step_ratio"] - 1) for r in rows)
    print(f"worst peak miss {worst_peak:.1%} (goal <= 10%), worst step-time miss {worst_step:.1%} (goal <= 30%); "
          f"load average {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"torch {torch.__version__}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "billion": billion, "date": started, "torch": torch.__version__,
                                         "load_start": load_start, "load_end": os.getloadavg(),
                                         "worst_peak_miss": worst_peak, "worst_step_miss": worst_step}, indent=1))


if __name__ == "__main__":
    main()
