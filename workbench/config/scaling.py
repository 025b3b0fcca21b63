"""Scaling rules for lr and warmup, effective batch, steps per epoch, and scaling tables.

Pure functions over numbers and a JobConfig; pandas is imported only to build tables (no torch).
With k = world_size / lr_ref_world_size:  none -> x1, linear -> x k, sqrt -> x sqrt(k),
capped -> x min(k, cap).  Effective batch = micro_batch_size x grad_accum_steps x world_size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from workbench.config.sections import JobConfig

RULES = ("none", "linear", "sqrt", "capped")


def multiplier(world_size: int, ref_world_size: int, rule: str, cap: float = 8.0) -> float:
    """The factor applied to the base lr (and warmup) when going from ref_world_size to world_size."""
    if rule not in RULES:
        raise ValueError(f"scaling.rule: unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    k = world_size / ref_world_size
    return {"none": 1.0, "linear": k, "sqrt": math.sqrt(k), "capped": min(k, cap)}[rule]


def parse_world_sizes(text: str, name: str = "world sizes") -> list[int]:
    """ "1,2,4,8" (or "1 2 4 8") -> [1, 2, 4, 8], sorted and without repeats; anything else is a
    ConfigError naming `name` (the CLI flag or the widget) and the fix."""
    from workbench.errors import ConfigError

    parts = [p.strip() for p in str(text).replace(" ", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError([f"{name}: expected positive whole numbers separated by commas, e.g. 1,2,4,8; "
                           f"got {text!r}"])
    return sorted({int(p) for p in parts})


def effective_batch(micro_batch_size: int, grad_accum_steps: int, world_size: int) -> int:
    return micro_batch_size * grad_accum_steps * world_size


def steps_per_epoch(dataset_size: int, micro_batch_size: int, grad_accum_steps: int, world_size: int,
                    drop_last: bool = True) -> int:
    """Optimizer steps per epoch, as the engine counts them.

    DistributedSampler gives each rank floor(n / world) samples with drop_last, else ceil (padded);
    the DataLoader makes micro-batches of them (the last one smaller unless drop_last); every
    grad_accum_steps micro-batches make a step (a trailing partial accumulation is not stepped)."""
    per_rank = dataset_size // world_size if drop_last else math.ceil(dataset_size / world_size)
    micro_batches = per_rank // micro_batch_size if drop_last else math.ceil(per_rank / micro_batch_size)
    return micro_batches // grad_accum_steps


@dataclass(frozen=True)
class Scaled:
    """lr and warmup of a config at a given world size under a rule."""

    world_size: int
    rule: str
    multiplier: float
    lr: float
    warmup_steps: int
    effective_batch: int


def scaled(cfg: JobConfig, world_size: int | None = None, rule: str | None = None) -> Scaled:
    """lr, warmup and effective batch of `cfg` at `world_size` (default: the config's own)."""
    n = cfg.world_size if world_size is None else world_size
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    rule = rule or cfg.scaling.rule
    m = multiplier(n, cfg.train.lr_ref_world_size, rule, cfg.scaling.cap)
    warm_m = m if cfg.scaling.scale_warmup else 1.0
    return Scaled(n, rule, m, cfg.train.lr * m, round(cfg.train.warmup_steps * warm_m),
                  effective_batch(cfg.train.micro_batch_size, cfg.train.grad_accum_steps, n))


MEASURED = ("samples_per_s", "speedup", "efficiency", "expected_speedup")


def scaling_table(cfg: JobConfig, world_sizes: Iterable[int] = (1, 2, 4, 8), rule: str | None = None,
                  dataset_size: int | None = None, compare_rules: bool = False,
                  measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per world size (and per rule when compare_rules) with batch, lr, warmup, steps/epoch.

    `measured` (a benchmark_scaling table) adds its samples_per_s, speedup, efficiency and
    expected_speedup columns by world size (empty where that world size was not measured)."""
    import pandas as pd

    size = dataset_size if dataset_size is not None else cfg.task.train_samples
    rules = RULES if compare_rules else (rule or cfg.scaling.rule,)
    rows = [_row(cfg, n, r, size) for n in world_sizes for r in rules]
    table = pd.DataFrame(rows)
    if compare_rules:  # the config's own row is its world size under its own rule
        table["selected"] &= table["rule"] == cfg.scaling.rule
    if measured is None:
        return table
    columns = ["world_size", *(c for c in MEASURED if c in measured)]
    return table.merge(measured[columns], on="world_size", how="left")


def _row(cfg: JobConfig, n: int, rule: str, size: int | None) -> dict[str, Any]:
    s = scaled(cfg, n, rule)
    t = cfg.train
    steps = steps_per_epoch(size, t.micro_batch_size, t.grad_accum_steps, n, cfg.data.drop_last) if size else None
    return {
        "world_size": n, "rule": rule, "micro_batch_size": t.micro_batch_size,
        "grad_accum_steps": t.grad_accum_steps, "effective_batch": s.effective_batch,
        "lr_multiplier": s.multiplier, "lr": s.lr, "warmup_steps": s.warmup_steps,
        "steps_per_epoch": steps, "selected": n == cfg.world_size,
    }


def describe_change(cfg: JobConfig, old_world_size: int, new_world_size: int) -> str:
    """One sentence on how effective batch, lr and warmup change between two world sizes."""
    a, b = scaled(cfg, old_world_size), scaled(cfg, new_world_size)
    return (f"world size {old_world_size} -> {new_world_size} under the {b.rule} rule: "
            f"effective batch {a.effective_batch} -> {b.effective_batch}, lr {a.lr:.3g} -> {b.lr:.3g}, "
            f"warmup {a.warmup_steps} -> {b.warmup_steps} steps")
