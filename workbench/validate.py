"""Cross-field checks of a JobConfig.  Each problem names the field and says how to fix it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from workbench.config import JobConfig

_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?$")
_MEM = re.compile(r"^\d+(\.\d+)?[KMGT]?B?$", re.IGNORECASE)


def parse_time_limit(text: str) -> int:
    """Minutes in a SLURM-style time limit: "90", "1:30:00", "2-00:00:00", "45:00" (MM:SS)."""
    text = str(text).strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"malformed time limit {text!r}")
    days, a, b, c = match.groups()
    if c is None and days is None:  # MM:SS
        minutes, seconds = int(a), int(b)
        hours = 0
    else:
        hours, minutes, seconds = int(a), int(b), int(c or 0)
    total = int(days or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if total <= 0:
        raise ValueError(f"time limit {text!r} is zero")
    return total


def config_problems(cfg: JobConfig, gpus: int | None = None) -> list[str]:
    """All problems of `cfg`; `gpus` is the GPU count per node of the target (None: detect)."""
    if gpus is None:
        gpus = target_gpus(cfg)
    problems: list[str] = []
    for check in _CHECKS:
        problems.extend(check(cfg, gpus))
    return problems


def target_gpus(cfg: JobConfig) -> int:
    """GPUs per node where the ranks will run: SLURM's gpus_per_node, else this machine's."""
    if cfg.launch.executor == "slurm":
        return cfg.launch.slurm.gpus_per_node
    from workbench.devices import visible_gpu_count

    return visible_gpu_count()


def _positive(value: object, path: str, fix: str) -> list[str]:
    if isinstance(value, int) and value >= 1:
        return []
    return [f"{path}: must be a positive whole number, got {value!r}; {fix}"]


def _train(cfg: JobConfig, gpus: int) -> list[str]:
    t = cfg.train
    out = _positive(t.micro_batch_size, "train.micro_batch_size", "set the per-rank batch, e.g. 32")
    out += _positive(t.grad_accum_steps, "train.grad_accum_steps", "use 1 for no accumulation")
    out += _positive(t.epochs, "train.epochs", "train for at least 1 epoch (or set max_steps)")
    out += _positive(t.lr_ref_world_size, "train.lr_ref_world_size", "use the world size the lr was tuned at")
    out += _positive(t.log_every_steps, "train.log_every_steps", "use 1 to log every step")
    out += _positive(t.keep_checkpoints, "train.keep_checkpoints", "keep at least 1")
    for name in ("max_steps", "eval_every_steps", "checkpoint_every_steps"):
        value = getattr(t, name)
        if value is not None:
            out += _positive(value, f"train.{name}", "or leave it empty")
    if not t.lr > 0:
        out.append(f"train.lr: must be > 0, got {t.lr}; typical AdamW values are 1e-4 to 1e-3")
    if t.warmup_steps < 0:
        out.append(f"train.warmup_steps: must be >= 0, got {t.warmup_steps}; use 0 for no warmup")
    if not 0 <= t.min_lr_ratio <= 1:
        out.append(f"train.min_lr_ratio: must be within [0, 1], got {t.min_lr_ratio}")
    if t.weight_decay < 0:
        out.append(f"train.weight_decay: must be >= 0, got {t.weight_decay}")
    if t.grad_clip_norm is not None and not t.grad_clip_norm > 0:
        out.append(f"train.grad_clip_norm: must be > 0, got {t.grad_clip_norm}; leave empty to disable clipping")
    if t.precision == "fp16" and gpus == 0:
        out.append("train.precision: fp16 needs CUDA (GradScaler); use bf16 or fp32 on CPU")
    es = t.early_stopping
    if es.patience is not None and es.patience < 1:
        out.append(f"train.early_stopping.patience: must be >= 1, got {es.patience}; leave empty to disable")
    if es.min_delta < 0:
        out.append(f"train.early_stopping.min_delta: must be >= 0, got {es.min_delta}")
    return out


def _data(cfg: JobConfig, gpus: int) -> list[str]:
    d = cfg.data
    out = []
    if d.num_workers < 0:
        out.append(f"data.num_workers: must be >= 0, got {d.num_workers}; 0 loads in the main process")
    if d.prefetch_factor is not None and d.num_workers == 0:
        out.append("data.prefetch_factor: needs data.num_workers > 0; leave it empty or add workers")
    if d.prefetch_factor is not None and d.prefetch_factor < 1:
        out.append(f"data.prefetch_factor: must be >= 1, got {d.prefetch_factor}")
    if d.persistent_workers and d.num_workers == 0:
        out.append("data.persistent_workers: needs data.num_workers > 0; set it to false or add workers")
    return out


def _scaling(cfg: JobConfig, gpus: int) -> list[str]:
    if cfg.scaling.cap < 1:
        return [f"scaling.cap: must be >= 1, got {cfg.scaling.cap}; the capped rule uses lr x min(k, cap)"]
    return []


def _dist(cfg: JobConfig, gpus: int) -> list[str]:
    d = cfg.dist
    out = _positive(d.nodes, "dist.nodes", "use 1 for a single machine")
    out += _positive(d.procs_per_node, "dist.procs_per_node", "use one rank per GPU, or 2 on CPU")
    if d.backend == "nccl" and gpus == 0:
        out.append("dist.backend: nccl needs CUDA GPUs and none are visible; use gloo (or auto) on CPU")
    if d.backend in ("xccl", "ccl") and gpus == 0 and not _xpu_available():
        out.append(f"dist.backend: {d.backend} needs Intel XPUs and none are visible; use gloo (or auto) on CPU")
    if gpus and isinstance(d.procs_per_node, int) and d.procs_per_node > gpus:
        out.append(
            f"dist.procs_per_node: {d.procs_per_node} ranks per node but only {gpus} GPU(s) visible; "
            f"set procs_per_node <= {gpus} (one rank per GPU)"
        )
    if d.bucket_cap_mb <= 0:
        out.append(f"dist.bucket_cap_mb: must be > 0, got {d.bucket_cap_mb}; torch's default is 25")
    if d.timeout_s < 1:
        out.append(f"dist.timeout_s: must be >= 1 second, got {d.timeout_s}")
    if d.threads_per_rank is not None:
        out += _positive(d.threads_per_rank, "dist.threads_per_rank", "or leave it empty for cores / ranks")
    if d.check_every_steps is not None:
        out += _positive(d.check_every_steps, "dist.check_every_steps", "or leave it empty to never check")
    if not d.straggler_threshold > 0:
        out.append(f"dist.straggler_threshold: must be > 0, got {d.straggler_threshold}; 0.2 flags ranks 20% slower")
    if not d.stall_after_s > 0:
        out.append(f"dist.stall_after_s: must be > 0 seconds, got {d.stall_after_s}")
    return out


def _launch(cfg: JobConfig, gpus: int) -> list[str]:
    lc = cfg.launch
    out = []
    try:
        parse_time_limit(lc.time_limit)
    except ValueError as exc:
        out.append(f"launch.time_limit: {exc}; write minutes (90) or [D-]HH:MM:SS (01:30:00)")
    if lc.executor == "local" and cfg.dist.nodes != 1:
        out.append(f"dist.nodes: local runs use one machine, got {cfg.dist.nodes}; set nodes: 1 or executor: slurm")
    if lc.slurm.mem is not None and not _MEM.match(str(lc.slurm.mem)):
        out.append(f"launch.slurm.mem: malformed memory {lc.slurm.mem!r}; write e.g. 16G or 64000M")
    if lc.slurm.gpus_per_node < 0:
        out.append(f"launch.slurm.gpus_per_node: must be >= 0, got {lc.slurm.gpus_per_node}")
    out += _positive(lc.slurm.cpus_per_task, "launch.slurm.cpus_per_task", "use at least 1")
    if not lc.run_root:
        out.append("launch.run_root: must name a folder, e.g. runs")
    return out


def _task(cfg: JobConfig, gpus: int) -> list[str]:
    from workbench.engine.tasks import task_name_problem

    problem = task_name_problem(cfg.task.name)
    return [f"task.name: {problem}"] if problem else []


def _xpu_available() -> bool:
    from workbench.devices import visible_xpu_count

    return visible_xpu_count() > 0


_CHECKS: list[Callable[[JobConfig, int], list[str]]] = [_task, _data, _train, _scaling, _dist, _launch]
