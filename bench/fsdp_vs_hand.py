"""Steady-state training throughput under FSDP2: the engine (dist.strategy fsdp2) as users launch it
vs a hand-written fully_shard loop launched by torchrun, side by side (issue 32, item 6).

    hand-written   torchrun --standalone --nproc_per_node=2 bench/hand_fsdp_loop.py
                   (DistributedSampler, fully_shard on the MLP's first Linear then the root, AdamW,
                   torch's clip_grad_norm_, no logging)
    engine         workbench.submit(cfg) + run.wait() with dist.strategy: fsdp2 (its own units: the
                   same Linear, then the root; its clip_grad_norm; a record every step, checks)

The job of bench/engine_throughput.py (synthetic 16-class MLP 256 -> 1024 -> 16, batch 64 per rank,
AdamW lr 1e-3 without weight decay, clipping at 1.0, 2 ranks on gloo, 1 thread per rank), so the two
benches compare; its machinery too (alternating rounds, each side first in turn; steady-state samples/s
from rank 0's end-of-step times after --warmup steps; CPU ms per step of every process it started).
FSDP2 on CPU is ~8x slower a step than DDP for this model (an all-gather per unit per forward and
backward, a reduce-scatter per unit, DTensor dispatch), hence fewer steps per run than the DDP bench.

    python bench/fsdp_vs_hand.py [--rounds 5] [--steps 300] [--warmup 50] [--json bench/fsdp/latest.json]

The verdict is the median of the per-round ratios engine / hand (target >= 0.97).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from engine_throughput import BATCH, CLIP, RANKS, TASK, alternate, engine, hand_loop, steady, summarize

from workbench.engine.builtin_tasks import synthetic_classification
from workbench.engine.strategy import pick_units

HAND_FSDP_LOOP = Path(__file__).with_name("hand_fsdp_loop.py")
TARGET = 0.97


def hand(root: Path, steps: int, warmup: int) -> list[float]:
    found = hand_loop(root, ["--steps", str(steps), "--batch", str(BATCH), "--clip", str(CLIP),
                             *(f"--{k.replace('_', '-')}={v}" for k, v in TASK.items())], script=HAND_FSDP_LOOP)
    assert found["threads"] == 1, found
    assert found["units"] == engine_units(), (found["units"], engine_units())  # both shard the same modules
    return steady(found["times"], warmup)


def engine_units() -> list[str]:
    """The paths the engine's FSDP2Strategy shards before the root, for the bench's model."""
    torch.manual_seed(0)
    return [path for path, _ in pick_units(synthetic_classification(**TASK).model, [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (every side)")
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of the steady window")
    parser.add_argument("--json", type=Path, help="write the settings and every round's figures here "
                        "(bench/fsdp/latest.json is the one bench/README.md quotes)")
    args = parser.parse_args()
    began, load_start = time.time(), os.getloadavg()
    sides: dict[str, Callable[[Path], list[float]]] = {
        "hand": lambda root: hand(root, args.steps, args.warmup),
        "engine": lambda root: engine(root, args.steps, args.warmup, dist={"strategy": "fsdp2"})}
    rounds = alternate(sides, args.rounds)
    medians = summarize(rounds, list(sides), TARGET, base_label="hand-written fully_shard loop (torchrun)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "what": "engine (workbench.submit, dist.strategy fsdp2) vs hand-written fully_shard loop "
                    "(bench/hand_fsdp_loop.py) under torchrun; steady-state samples/s, alternating rounds",
            "date": time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(began)), "wall_s": round(time.time() - began),
            "torch": torch.__version__, "ranks": RANKS, "task": TASK, "batch_per_rank": BATCH, "clip": CLIP,
            "steps": args.steps, "warmup": args.warmup, "units": engine_units(),
            "load_start": load_start, "load_end": os.getloadavg(),
            "engine_vs_hand": medians["engine"], "target": TARGET,
            "engine_vs_hand_rounds": [r["ratio engine"] for r in rounds],
            "median_samples_per_s": {name: statistics.median(r[name]["samples_per_s"] for r in rounds)
                                     for name in sides},
            "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
