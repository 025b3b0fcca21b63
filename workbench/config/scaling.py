"""Scaling rules for lr and warmup, effective batch, steps per epoch, and scaling tables.

Pure functions over numbers and a JobConfig; pandas is imported only to build tables (no torch).
Effective batch = micro_batch_size x grad_accum_steps x world_size.  The rules scale lr (and warmup)
with the effective batch, as Goyal et al. (2017) define the linear rule and the guides write it
("lr_new = lr_base x total_batch / base_batch"): with k = effective batch / train.lr_ref_batch,
none -> x1, linear -> x k, sqrt -> x sqrt(k), capped -> x min(k, cap).  A config without
lr_ref_batch was tuned at micro x accum x lr_ref_world_size: k is then the world-size ratio.
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


def multiplier(batch: float, ref_batch: float, rule: str, cap: float = 8.0) -> float:
    """The factor applied to the base lr (and warmup) going from the reference effective batch to `batch`
    (or, equally, from a reference world size to a world size at a fixed per-rank batch)."""
    if rule not in RULES:
        raise ValueError(f"scaling.rule: unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    k = batch / ref_batch
    return {"none": 1.0, "linear": k, "sqrt": math.sqrt(k), "capped": min(k, cap)}[rule]


def reference_batch(train: Any) -> int:
    """The effective batch a config's lr and warmup were tuned at (its TrainConfig): lr_ref_batch, or
    micro_batch_size x grad_accum_steps x lr_ref_world_size."""
    if train.lr_ref_batch:
        return int(train.lr_ref_batch)
    return effective_batch(train.micro_batch_size, train.grad_accum_steps, train.lr_ref_world_size)


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


def too_small_message(cfg: JobConfig, world_size: int, dataset_size: int) -> str:
    """The one line for a training set smaller than one optimizer step (an epoch of no step), as the
    ranks raise it and `workbench check` says it before a run."""
    per_step = effective_batch(cfg.train.micro_batch_size, cfg.train.grad_accum_steps, world_size)
    return (f"train.micro_batch_size: the training set has {dataset_size} samples but one optimizer step needs "
            f"{per_step} (micro_batch_size x grad_accum_steps x world_size); lower micro_batch_size "
            f"or grad_accum_steps, or use fewer ranks")


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
    reference_batch: int = 0
    """The effective batch the base lr was tuned at (the multiplier is the rule of their ratio)."""


def scaled(cfg: JobConfig, world_size: int | None = None, rule: str | None = None) -> Scaled:
    """lr, warmup and effective batch of `cfg` at `world_size` (default: the config's own)."""
    n = cfg.world_size if world_size is None else world_size
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    rule = rule or cfg.scaling.rule
    batch = effective_batch(cfg.train.micro_batch_size, cfg.train.grad_accum_steps, n)
    reference = reference_batch(cfg.train)
    m = multiplier(batch, reference, rule, cfg.scaling.cap)
    warm_m = m if cfg.scaling.scale_warmup else 1.0
    return Scaled(n, rule, m, cfg.train.lr * m, round(cfg.train.warmup_steps * warm_m), batch, reference)


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


def reference_note(cfg: JobConfig) -> str:
    """Where the lr scales from, in one sentence: "lr 0.002 and warmup 20 were tuned at effective batch 64
    (32 x 2 x 1 rank: train.lr_ref_world_size; set train.lr_ref_batch to tune them at another batch);
    sqrt rule: lr x sqrt(effective batch / 64)"."""
    t = cfg.train
    reference = reference_batch(t)
    if t.lr_ref_batch:
        source = "train.lr_ref_batch"
    else:
        ranks = "rank" if t.lr_ref_world_size == 1 else "ranks"
        source = (f"{t.micro_batch_size} x {t.grad_accum_steps} x {t.lr_ref_world_size} {ranks}: "
                  "train.lr_ref_world_size; set train.lr_ref_batch to keep it when the per-rank batch changes")
    formula = {"none": "lr unchanged", "linear": f"lr x effective batch / {reference}",
               "sqrt": f"lr x sqrt(effective batch / {reference})",
               "capped": f"lr x min(effective batch / {reference}, {cfg.scaling.cap:g})"}[cfg.scaling.rule]
    warmup = f" and warmup {t.warmup_steps}" if t.warmup_steps else ""
    return (f"lr {t.lr:g}{warmup} tuned at effective batch {reference} ({source}); "
            f"{cfg.scaling.rule} rule: {formula}")


def describe_change(cfg: JobConfig, old_world_size: int, new_world_size: int, old: JobConfig | None = None) -> str:
    """One sentence on how effective batch, lr and warmup change between two world sizes (`old`: the
    config the run had at the old world size, when it differs)."""
    a, b = scaled(old or cfg, old_world_size), scaled(cfg, new_world_size)
    return (f"world size {old_world_size} -> {new_world_size} under the {b.rule} rule: "
            f"effective batch {a.effective_batch} -> {b.effective_batch}, lr {a.lr:.3g} -> {b.lr:.3g}, "
            f"warmup {a.warmup_steps} -> {b.warmup_steps} steps")


@dataclass(frozen=True)
class Resize:
    """How a run trained at one world size continues at another (workbench.submit(cfg, run_dir=...))."""

    config: JobConfig
    """What the run continues with: grad_accum_steps changed to keep the effective batch when it can,
    and train.lr_ref_batch pinned to the batch the lr was tuned at, so the lr means what it meant."""
    kept_batch: bool
    message: str


def resize(old: JobConfig, old_world_size: int, cfg: JobConfig, world_size: int) -> Resize:
    """The effective batch is kept by changing grad_accum_steps when it divides (and
    train.keep_batch_on_resize); else lr and warmup follow the scaling rule for the new batch."""
    t = cfg.train
    pinned = cfg.replace(train__lr_ref_batch=t.lr_ref_batch or reference_batch(old.train))
    if world_size == old_world_size:
        return Resize(cfg, True, "")
    batch = effective_batch(old.train.micro_batch_size, old.train.grad_accum_steps, old_world_size)
    per_accum = t.micro_batch_size * world_size
    if t.keep_batch_on_resize and batch % per_accum == 0:
        accum = batch // per_accum
        kept = pinned.replace(train__grad_accum_steps=accum)
        s = scaled(kept, world_size)
        return Resize(kept, True, f"world size {old_world_size} -> {world_size}: grad_accum_steps "
                                  f"{old.train.grad_accum_steps} -> {accum} keeps the effective batch {batch} "
                                  f"(lr {s.lr:.3g}, warmup {s.warmup_steps} steps, as before)")
    why = ("train.keep_batch_on_resize is false" if not t.keep_batch_on_resize else
           f"the effective batch {batch} is not a multiple of micro_batch_size {t.micro_batch_size} x "
           f"{world_size} ranks, so no grad_accum_steps keeps it")
    return Resize(pinned, False, f"{describe_change(pinned, old_world_size, world_size, old)} ({why})")
