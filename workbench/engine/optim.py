"""Optimizer and learning-rate schedule (warmup, then constant, linear or cosine decay)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from workbench.config.sections import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    kwargs: dict[str, Any] = dict(cfg.optimizer_kwargs)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=cfg.weight_decay, **kwargs)
    return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, **kwargs)


def lr_factor(schedule: str, warmup_steps: int, total_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup, then decay."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant" or total_steps <= warmup_steps:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_ratio + (1.0 - min_ratio) * decay

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, warmup_steps: int,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    fn = lr_factor(cfg.schedule, warmup_steps, total_steps, cfg.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
