"""Checks of a JobConfig, in two kinds that run at different times.  Each message names the field and the fix.

**Value checks** (`value_problems`, `section_problems`) look at the config's values only: pure functions,
no torch, no files, no GPU detection.  They run whenever a config is built (``JobConfig(...)``, each
section's own constructor, ``from_dict``, ``from_yaml``, ``replace``, ``with_overrides`` and so the CLI's
``--set``), together with the type checks, so a config that exists has none of these problems:

- bounds of single fields: batch sizes, steps and intervals, lr, ratios, timeouts, cap, bucket size;
- pairs inside a section: prefetch_factor and persistent_workers need num_workers > 0;
- formats: launch.time_limit ([D-]HH:MM:SS or minutes), launch.slurm.mem (16G), a non-empty run_root
  without NUL or control characters, launch.name one plain folder name (no / or \\, no leading dot,
  at most MAX_NAME characters: the run folder stays inside run_root);
- across sections: a local run uses one node (dist.nodes with launch.executor).

**Target checks** (`target_problems`) depend on the machine the ranks run on: its GPU count (nccl needs
CUDA, at most one rank per GPU, xccl/ccl need Intel XPUs), its cores (a local CPU run has at
most LOCAL_RANKS_PER_CORE ranks per core), whether the task's module can be imported there, and whether
launch.run_root can be written from here (the run folder is made before anything is submitted).
They run in ``cfg.problems()`` / ``cfg.check()``, which return value and target problems together:
``submit`` calls them before starting a job and ``workbench check`` prints them all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME = 100
"""Longest launch.name (a folder name may have 255 bytes; the time stamp is added)."""
_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?$")
_MEM = re.compile(r"^\d+(\.\d+)?[KMGT]?B?$", re.IGNORECASE)


def parse_time_limit(text: str | int) -> int:
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


# --- entry points ------------------------------------------------------------------------------


def config_problems(cfg: JobConfig, gpus: int | None = None) -> list[str]:
    """All problems of `cfg`: value and target; `gpus` is the GPU count per node of the target (None: detect)."""
    return value_problems(cfg) + target_problems(cfg, gpus)


def value_problems(cfg: JobConfig, broken: Iterable[str] = ()) -> list[str]:
    """Problems found from the values alone.  Checks reading a field in `broken` (it had a type
    error, or lies in a section that did) are skipped: they would only repeat noise about it."""
    broken = tuple(broken)
    problems: list[str] = []
    for path in _SECTION_RULES:
        if not _is_broken(path, broken):
            problems += section_problems(_section(cfg, path), path, broken)
    return problems + _run(_CROSS_RULES, cfg, broken)


def section_problems(section: Any, path: str, broken: Iterable[str] = ()) -> list[str]:
    """Value problems of one section (e.g. path "train" or "launch.slurm"), nested sections excluded."""
    return _run(_SECTION_RULES[path], section, tuple(broken))


def target_problems(cfg: JobConfig, gpus: int | None = None) -> list[str]:
    """Problems only the target machine can tell: its GPUs (None: detect) and the task's importability."""
    if gpus is None:
        gpus = target_gpus(cfg)
    return (_task(cfg) + _backend(cfg, gpus) + _ranks_per_gpu(cfg, gpus)
            + _local_ranks_per_core(cfg, gpus) + _run_root_writable(cfg))


def target_gpus(cfg: JobConfig) -> int:
    """GPUs per node where the ranks will run: SLURM's gpus_per_node, else this machine's."""
    if cfg.launch.executor == "slurm":
        return cfg.launch.slurm.gpus_per_node
    from workbench.config.devices import visible_gpu_count

    return visible_gpu_count()


# --- value checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One value check: the field paths it reads and a function of their section (or of the JobConfig
    for rules across sections) that returns the message, or None when the values are fine."""

    reads: tuple[str, ...]
    check: Callable[[Any], str | None]


def _run(rules: list[Rule], obj: Any, broken: tuple[str, ...]) -> list[str]:
    found = (rule.check(obj) for rule in rules if not any(_is_broken(p, broken) for p in rule.reads))
    return [message for message in found if message]


def _is_broken(path: str, broken: tuple[str, ...]) -> bool:
    return any(path == b or path.startswith(f"{b}.") for b in broken)


def _section(cfg: JobConfig, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _bound(path: str, ok: Callable[[Any], bool], rule: str, fix: str, optional: bool = False) -> Rule:
    """A rule on one field: `ok(value)` must hold (None is fine when `optional`)."""
    name = path.rsplit(".", 1)[1]

    def check(section: Any) -> str | None:
        value = getattr(section, name)
        if (optional and value is None) or ok(value):
            return None
        return f"{path}: {rule}, got {value!r}; {fix}"

    return Rule((path,), check)


def _positive(path: str, fix: str, optional: bool = False) -> Rule:
    return _bound(path, lambda v: v >= 1, "must be a positive whole number", fix, optional)


def _at_least(path: str, low: float, fix: str, optional: bool = False) -> Rule:
    return _bound(path, lambda v: v >= low, f"must be >= {low}", fix, optional)


def _above(path: str, low: float, fix: str, optional: bool = False) -> Rule:
    return _bound(path, lambda v: v > low, f"must be > {low}", fix, optional)


def _prefetch_needs_workers(d: Any) -> str | None:
    if d.prefetch_factor is not None and d.num_workers < 1:
        return "data.prefetch_factor: needs data.num_workers > 0; leave it empty or add workers"
    return None


def _comm_hook_is_ddps(d: Any) -> str | None:
    if d.strategy == "fsdp2" and d.comm_hook != "none":
        return (f"dist.comm_hook: {d.comm_hook} compresses DDP's all-reduce; fsdp2 reduce-scatters in fp32 "
                "(bf16 parameters with train.precision: bf16); set dist.comm_hook: none")
    return None


def _fsdp_unit_names(d: Any) -> str | None:
    bad = [name for name in d.fsdp_units if not name.isidentifier()]
    if bad:
        return (f"dist.fsdp_units: {', '.join(map(repr, bad))} is not a class name; list module class names "
                "such as [Block], or leave it empty for the model's repeated blocks")
    return None


def _persistent_needs_workers(d: Any) -> str | None:
    if d.persistent_workers and d.num_workers < 1:
        return "data.persistent_workers: needs data.num_workers > 0; set it to false or add workers"
    return None


def _min_lr_ratio(t: Any) -> str | None:
    if 0 <= t.min_lr_ratio <= 1:
        return None
    return (f"train.min_lr_ratio: must be within [0, 1], got {t.min_lr_ratio!r}; "
            "use 0 to decay to zero, 1 to keep the peak lr")


def _time_limit(launch: Any) -> str | None:
    try:
        parse_time_limit(launch.time_limit)
    except ValueError as exc:
        return f"launch.time_limit: {exc}; write minutes (90) or [D-]HH:MM:SS (01:30:00)"
    return None


def _run_root(launch: Any) -> str | None:
    if not launch.run_root.strip():
        return "launch.run_root: must name a folder; write e.g. runs"
    if _CONTROL.search(launch.run_root):
        return (f"launch.run_root: {launch.run_root!r} holds a NUL or control character; "
                "write a plain path, e.g. runs or /scratch/me/runs")
    return None


def _run_name(launch: Any) -> str | None:
    """The run folder is <run_root>/<name>-<time>: the name must stay one plain folder name."""
    name = launch.name
    if name is None:
        return None
    why = ("is empty" if not name.strip() else
           "holds a NUL or control character" if _CONTROL.search(name) else
           "holds a path separator (/ or \\), so the run folder would land elsewhere" if "/" in name or "\\" in name
           else "starts with a dot (a hidden folder, or .. to climb out of run_root)" if name.startswith(".")
           else f"is longer than {MAX_NAME} characters" if len(name) > MAX_NAME else "")
    if not why:
        return None
    return (f"launch.name: {name[:60]!r} {why}; write one plain folder name, e.g. lr-sweep-1, or leave it empty "
            "for the task's name (set launch.run_root to choose where runs go)")


def _mem(slurm: Any) -> str | None:
    if slurm.mem is None or _MEM.match(str(slurm.mem)):
        return None
    return f"launch.slurm.mem: malformed memory {slurm.mem!r}; write e.g. 16G or 64000M, or leave it empty"


def _local_runs_one_node(cfg: JobConfig) -> str | None:
    if cfg.launch.executor == "local" and cfg.dist.nodes != 1:
        return (f"dist.nodes: local runs use one machine, got {cfg.dist.nodes}; "
                "set dist.nodes: 1 or launch.executor: slurm")
    return None


_SECTION_RULES: dict[str, list[Rule]] = {
    "task": [],
    "data": [
        _at_least("data.num_workers", 0, "0 loads in the rank's main process"),
        _positive("data.prefetch_factor", "or leave it empty for torch's default", optional=True),
        Rule(("data.prefetch_factor", "data.num_workers"), _prefetch_needs_workers),
        Rule(("data.persistent_workers", "data.num_workers"), _persistent_needs_workers),
    ],
    "train": [
        _positive("train.micro_batch_size", "set the per-rank batch, e.g. 32"),
        _positive("train.grad_accum_steps", "use 1 for no accumulation"),
        _positive("train.epochs", "train for at least 1 epoch (or set max_steps)"),
        _positive("train.max_steps", "or leave it empty to train for `epochs`", optional=True),
        _above("train.lr", 0, "typical AdamW values are 1e-4 to 1e-3"),
        _positive("train.lr_ref_batch", "the effective batch (micro x accum x ranks) the lr was tuned at, or "
                  "leave it empty for micro_batch_size x grad_accum_steps x lr_ref_world_size", optional=True),
        _positive("train.lr_ref_world_size", "use the world size the lr was tuned at"),
        _at_least("train.warmup_steps", 0, "use 0 for no warmup"),
        Rule(("train.min_lr_ratio",), _min_lr_ratio),
        _at_least("train.weight_decay", 0, "use 0 for none; AdamW often uses 0.01 to 0.1"),
        _above("train.grad_clip_norm", 0, "leave it empty to disable clipping", optional=True),
        _positive("train.log_every_steps", "use 1 to log every step"),
        _positive("train.eval_every_steps", "or leave it empty to validate at each epoch's end", optional=True),
        _positive("train.checkpoint_every_steps", "or leave it empty to save at each epoch's end", optional=True),
        _positive("train.keep_checkpoints", "keep at least 1"),
    ],
    "train.early_stopping": [
        _positive("train.early_stopping.patience", "leave it empty to disable early stopping", optional=True),
        _at_least("train.early_stopping.min_delta", 0, "use 0 to count any improvement"),
    ],
    "scaling": [_at_least("scaling.cap", 1, "the capped rule uses lr x min(k, cap)")],
    "dist": [
        _positive("dist.nodes", "use 1 for a single machine"),
        _positive("dist.procs_per_node", "use one rank per GPU, or 2 on CPU"),
        _above("dist.bucket_cap_mb", 0, "torch's default is 25"),
        _positive("dist.threads_per_rank", "or leave it empty for cores / ranks", optional=True),
        _positive("dist.timeout_s", "collectives need at least 1 second; the default is 600"),
        _positive("dist.check_every_steps", "or leave it empty to never check", optional=True),
        _above("dist.straggler_threshold", 0, "0.2 flags ranks 20% slower than the median"),
        _above("dist.stall_after_s", 0, "e.g. 300 (five minutes without a step), or leave it empty to follow "
               "the job's pace", optional=True),
        _at_least("dist.lost_after_s", 5, "ranks beat every 2 s: a shorter wait calls live ranks lost (default 60)"),
        Rule(("dist.comm_hook", "dist.strategy"), _comm_hook_is_ddps),
        Rule(("dist.fsdp_units",), _fsdp_unit_names),
    ],
    "launch": [Rule(("launch.time_limit",), _time_limit), Rule(("launch.run_root",), _run_root),
               Rule(("launch.name",), _run_name),
               _at_least("launch.max_restarts", 0, "use 0 to fail the run at the first failure")],
    "launch.slurm": [
        Rule(("launch.slurm.mem",), _mem),
        _at_least("launch.slurm.gpus_per_node", 0, "use 0 to run on CPUs"),
        _positive("launch.slurm.cpus_per_task", "use at least 1"),
    ],
    "log": [],  # the mirrors' packages are checked where they run: a missing one becomes a warning event
}
"""Section path -> its value rules; every section of JobConfig has an entry (nested ones too)."""

_CROSS_RULES: list[Rule] = [Rule(("dist.nodes", "launch.executor"), _local_runs_one_node)]
"""Value rules across sections, given the whole JobConfig."""


# --- target checks -----------------------------------------------------------------------------


def _task(cfg: JobConfig) -> list[str]:
    from workbench.config.tasknames import task_name_problem  # may probe the module with find_spec

    problem = task_name_problem(cfg.task.name)
    return [f"task.name: {problem}"] if problem else []


def _backend(cfg: JobConfig, gpus: int) -> list[str]:
    backend = cfg.dist.backend
    if backend == "nccl" and gpus == 0:
        return ["dist.backend: nccl needs CUDA GPUs and none are visible; use gloo (or auto) on CPU"]
    if backend in ("xccl", "ccl") and gpus == 0 and not _xpu_available():
        return [f"dist.backend: {backend} needs Intel XPUs and none are visible; use gloo (or auto) on CPU"]
    return []


def _ranks_per_gpu(cfg: JobConfig, gpus: int) -> list[str]:
    procs = cfg.dist.procs_per_node
    if gpus and procs > gpus:
        return [f"dist.procs_per_node: {procs} ranks per node but only {gpus} GPU(s) visible; "
                f"set procs_per_node <= {gpus} (one rank per GPU)"]
    return []


LOCAL_RANKS_PER_CORE = 4
"""On CPU, a local run may have at most this many ranks per core of the machine."""


def _local_ranks_per_core(cfg: JobConfig, gpus: int) -> list[str]:
    procs = cfg.dist.procs_per_node
    if cfg.launch.executor != "local" or gpus:
        return []
    cores = _cores()
    if procs <= LOCAL_RANKS_PER_CORE * cores:
        return []
    return [f"dist.procs_per_node: {procs} local ranks on a machine with {cores} core(s); set procs_per_node "
            f"<= {LOCAL_RANKS_PER_CORE * cores} ({LOCAL_RANKS_PER_CORE} per core), or run on SLURM "
            "(launch.executor: slurm)"]


def _cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a cgroup or taskset)
    except AttributeError:
        return os.cpu_count() or 1


def _run_root_writable(cfg: JobConfig) -> list[str]:
    """The run root, or the folder it would be made in, exists as a folder and can be written."""
    import os
    from pathlib import Path

    root = Path(cfg.launch.run_root).expanduser()
    try:
        existing = next(p for p in (root, *root.absolute().parents) if os.path.lexists(p))
        is_dir = existing.is_dir()
        writable = os.access(existing, os.W_OK | os.X_OK)
    except (OSError, StopIteration) as exc:
        return [f"launch.run_root: cannot use {str(root)!r} ({exc}); choose a folder you can write, e.g. runs"]
    if not is_dir:
        return [f"launch.run_root: {existing} is a file, not a folder; choose a folder, e.g. runs"]
    if not writable:
        made = "" if existing == root else f" (where {root} would be made)"
        return [f"launch.run_root: cannot write to {existing}{made}; choose a folder you can write, "
                "e.g. runs or a folder under your home"]
    return []


def _xpu_available() -> bool:
    from workbench.config.devices import visible_xpu_count

    return visible_xpu_count() > 0
