"""Typed job configuration: one keyword-only, frozen dataclass per section, YAML round trip, validation.

Every field has a docstring (the string literal under it); the widgets form and the CLI's help read
them from here.  A config is valid by construction: building one -- ``JobConfig(...)``, a section such
as ``TrainConfig(...)``, ``from_dict``, ``from_yaml``, ``replace``, ``with_overrides`` -- checks the
types and values of every field (`workbench.config.validate` says which checks run when) and raises one
ConfigError listing every problem, each naming the field and the fix.  A built config cannot be
changed in place; derive a new one with ``replace`` or ``with_overrides``.  What only the target
machine can tell (GPUs, an importable task) is checked by ``problems()`` / ``check()``, at submit
time and by ``workbench check``, which prints every problem.  YAML is read with a
``yaml.SafeLoader`` only: a config is data, never code.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workbench.config import validate
from workbench.config.types import (
    ConfigError,
    _short,
    coerce,
    field_docs,
    problem_fields,
    shown,
    unknown_key_message,
    yaml_load,
)
from workbench.errors import ConfigFileError

Backend = Literal["auto", "nccl", "gloo", "xccl", "ccl"]
Precision = Literal["fp32", "bf16", "fp16"]


@dataclass(kw_only=True, frozen=True)
class TaskConfig:
    name: str = "synthetic"
    """Built-in task ("synthetic", "charlm") or a user factory as "package.module:factory"."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the task factory (sizes, dims, ...)."""
    train_samples: int | None = None
    """Training-set size for steps-per-epoch in scaling tables; taken from the task when empty."""

    def __post_init__(self) -> None:
        _settle(self, "task")


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    num_workers: int = 0
    """DataLoader worker processes per rank (0 loads in the rank's main process)."""
    pin_memory: bool = False
    """Pin host memory for faster host-to-GPU copies (only useful on CUDA)."""
    drop_last: bool = True
    """Drop the last incomplete micro-batch of each rank's shard, so every step has the same size."""
    prefetch_factor: int | None = None
    """Batches loaded in advance by each worker; needs num_workers > 0 (empty = torch default)."""
    persistent_workers: bool = False
    """Keep DataLoader workers alive between epochs; needs num_workers > 0."""

    def __post_init__(self) -> None:
        _settle(self, "data")


@dataclass(kw_only=True, frozen=True)
class EarlyStoppingConfig:
    metric: str = "val_loss"
    """Validation metric watched for early stopping."""
    mode: Literal["min", "max"] = "min"
    """Whether a lower ("min") or higher ("max") metric is better."""
    patience: int | None = None
    """Evaluations without improvement before stopping; empty disables early stopping."""
    min_delta: float = 0.0
    """Smallest change of the metric that counts as an improvement."""

    def __post_init__(self) -> None:
        _settle(self, "train.early_stopping")


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    micro_batch_size: int = 32
    """Samples per rank per forward/backward pass (the per-GPU batch size)."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated before each optimizer step."""
    epochs: int = 1
    """Passes over the training set (ignored when max_steps is set and reached first)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps; empty trains for `epochs`."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """Optimizer: AdamW or SGD."""
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra optimizer arguments, e.g. {betas: [0.9, 0.95]} or {momentum: 0.9}."""
    lr: float = 1e-3
    """Base learning rate, tuned at the effective batch `lr_ref_batch`; scaled by the scaling rule."""
    lr_ref_batch: int | None = None
    """Effective batch (micro x accum x ranks) the base lr and warmup were tuned at; the rule scales by
    effective batch / this.  Empty: micro_batch_size x grad_accum_steps x lr_ref_world_size."""
    lr_ref_world_size: int = 1
    """World size the base lr and warmup were tuned at, when lr_ref_batch is empty."""
    warmup_steps: int = 0
    """Linear warmup steps at the reference batch; scaled by the scaling rule."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warmup."""
    min_lr_ratio: float = 0.0
    """Final lr as a fraction of the peak lr, for linear and cosine schedules."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW) or L2 penalty (SGD)."""
    grad_clip_norm: float | None = 1.0
    """Clip the global gradient norm to this value; empty disables clipping."""
    precision: Precision = "fp32"
    """Numeric precision: fp32, bf16 autocast, or fp16 autocast with a GradScaler (CUDA or CPU)."""
    seed: int = 0
    """Random seed; each rank seeds with seed + rank, data order depends on seed only."""
    log_every_steps: int = 1
    """Write a metrics record (and reduce the loss across ranks) every this many steps."""
    eval_every_steps: int | None = None
    """Run validation every this many steps; empty validates at the end of each epoch."""
    checkpoint_every_steps: int | None = None
    """Write a checkpoint every this many steps (plus one at the end); empty: end of each epoch."""
    keep_checkpoints: int = 2
    """Number of most recent checkpoints kept on disk."""
    keep_batch_on_resize: bool = True
    """Resuming at another world size: change grad_accum_steps so the effective batch (and so lr and
    warmup) stays what it was, when it divides; otherwise, or when false, lr and warmup follow the
    scaling rule for the new effective batch.  The run's start line says which."""
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    """Stop when a validation metric stops improving."""

    def __post_init__(self) -> None:
        _settle(self, "train")


@dataclass(kw_only=True, frozen=True)
class ScalingConfig:
    rule: Literal["none", "linear", "sqrt", "capped"] = "linear"
    """How lr and warmup change with the effective batch, k = effective batch / train.lr_ref_batch:
    none (unchanged), linear (x k), sqrt (x sqrt(k)), capped (x min(k, cap))."""
    cap: float = 8.0
    """Largest multiplier of the capped rule."""
    scale_warmup: bool = True
    """Scale warmup steps with the same multiplier as the lr."""

    def __post_init__(self) -> None:
        _settle(self, "scaling")


@dataclass(kw_only=True, frozen=True)
class DistConfig:
    nodes: int = 1
    """Number of machines (SLURM nodes); local runs use 1."""
    procs_per_node: int = 2
    """Ranks per node (one per GPU on GPU machines)."""
    backend: Backend = "auto"
    """Process-group backend: auto picks nccl on CUDA, xccl on XPU, gloo on CPU."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """ddp: every rank holds the whole model, its gradients and optimizer state; fsdp2 (fully_shard):
    each rank holds 1/world_size of them, for models DDP cannot hold.  Same losses, same config."""
    fsdp_units: list[str] = field(default_factory=list)
    """fsdp2: module class names sharded as one unit each (all-gathered together in forward and
    backward); empty: the model's repeated blocks (e.g. its transformer layers), else its large children."""
    reshard_after_forward: bool = True
    """fsdp2: free the gathered parameters after each unit's forward (less memory, one more all-gather
    in backward); false keeps them until backward (ZeRO-2-like: faster, more memory).  The root's own
    parameters are kept either way (torch's default: backward needs them first)."""
    find_unused_parameters: bool = False
    """DDP: search for parameters without gradients each step (slower; only if the model needs it)."""
    gradient_as_bucket_view: bool = True
    """DDP: gradients are views into the all-reduce buckets (saves memory and a copy)."""
    static_graph: bool = False
    """DDP: the set of used parameters never changes between steps (enables optimisations)."""
    bucket_cap_mb: float = 25.0
    """DDP: gradient bucket size in MiB for all-reduce."""
    threads_per_rank: int | None = None
    """CPU threads per rank (torch.set_num_threads); empty: OMP_NUM_THREADS, else cores / ranks per node."""
    comm_hook: Literal["none", "fp16", "bf16"] = "none"
    """Gradient compression for all-reduce: none, fp16 or bf16."""
    timeout_s: int = 600
    """Seconds a collective may wait before the process group fails (a dead or hung rank)."""
    measure_comm: bool = True
    """Time the gradient all-reduce with a communication hook (comm_wait_s and comm_busy_s per step)."""
    check_every_steps: int | None = 100
    """Every this many steps, ranks compare parameter checksums and step times (empty: never)."""
    straggler_threshold: float = 0.2
    """A rank whose median step time exceeds the ranks' median by this fraction is a straggler."""
    stall_after_s: float | None = None
    """Seconds without a finished step (or printed line) before a rank is reported stalled, its
    stacks dumped, and a rank stuck outside a collective while others wait in one named hung; empty:
    from the job's own pace, 10x its slowest step so far, at least 60 (300 before the first step)."""
    on_hang: Literal["fail", "warn"] = "fail"
    """A rank named hung: fail ends the run at once with it as the cause; warn only says so."""
    lost_after_s: float = 60.0
    """Seconds without a heartbeat (ranks beat every 2 s) before a rank is called lost and the run stops
    (at least 60 while a rank is still starting: importing torch can hold it that long on a busy machine)."""

    def __post_init__(self) -> None:
        _settle(self, "dist")


@dataclass(kw_only=True, frozen=True)
class SlurmConfig:
    partition: str | None = None
    """SLURM partition (empty = the cluster default)."""
    account: str | None = None
    """SLURM account to charge."""
    qos: str | None = None
    """SLURM quality of service."""
    mem: str | None = None
    """Memory per node, e.g. "16G" (empty = the cluster default)."""
    gpus_per_node: int = 0
    """GPUs per node; 0 runs on CPUs."""
    cpus_per_task: int = 1
    """CPU cores per rank (data-loader workers need cores too)."""
    constraint: str | None = None
    """SLURM node constraint, e.g. "a100"."""
    sbatch_options: dict[str, Any] = field(default_factory=dict)
    """Extra sbatch options, e.g. {reservation: xyz}."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before the job, e.g. "module load cuda"."""

    def __post_init__(self) -> None:
        _settle(self, "launch.slurm")


@dataclass(kw_only=True, frozen=True)
class LaunchConfig:
    executor: Literal["local", "slurm"] = "local"
    """Where ranks run: this machine (local) or a SLURM cluster (slurm)."""
    run_root: str = "runs"
    """Folder under which each run gets its own folder."""
    name: str | None = None
    """Run name (empty = task name); the run folder is <run_root>/<name>-<timestamp>."""
    time_limit: str | int = "01:00:00"
    """Wall-time limit of the job, as [D-]HH:MM:SS or minutes."""
    max_restarts: int = 0
    """After a rank fails, start every rank again from the latest checkpoint this many times (locally
    and on SLURM, within the job), like torchrun's --max-restarts; each attempt's failure is kept.
    The ranks see the attempt as TORCHELASTIC_RESTART_COUNT."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """SLURM resources (used when executor is slurm)."""

    def __post_init__(self) -> None:
        _settle(self, "launch")


@dataclass(kw_only=True, frozen=True)
class LogConfig:
    tensorboard: bool = False
    """Mirror every rank's metrics and eval results to TensorBoard while training, one event file per
    rank under <run>/tensorboard/rank{R} (`tensorboard --logdir <run>/tensorboard`); needs tensorboard."""
    wandb: bool = False
    """Mirror rank 0's metrics (loss, reduced loss, lr, timings) and eval results to Weights & Biases
    (one W&B run per workbench run, its files under <run>/wandb); needs wandb."""
    wandb_project: str = "workbench"
    """The W&B project."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """W&B mode (empty: WANDB_MODE or W&B's default); offline writes files only, `wandb sync` uploads."""
    mlflow: bool = False
    """Mirror rank 0's metrics and eval results to MLflow, with the config as parameters; needs mlflow."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI (empty: MLFLOW_TRACKING_URI or MLflow's default ./mlruns), e.g. file:/path/mlruns."""
    mlflow_experiment: str = "workbench"
    """The MLflow experiment."""
    measure_memory: bool = True
    """Measure each rank's peak memory over its first two steps (CUDA: max_memory_allocated; CPU: torch's
    MemTracker on the real tensors, those two steps slower), which run.plan() checks the plan against."""

    def __post_init__(self) -> None:
        _settle(self, "log")


@dataclass(kw_only=True, frozen=True)
class JobConfig:
    """A whole DDP job: what to train, how, on how many ranks and where."""

    task: TaskConfig = field(default_factory=TaskConfig)
    """What to train: model, data and loss."""
    data: DataConfig = field(default_factory=DataConfig)
    """How each rank loads its data shard."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimisation loop."""
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    """How lr and warmup follow the world size."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Process group and DDP options."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Where and with what resources the job runs."""
    log: LogConfig = field(default_factory=LogConfig)
    """Live copies of the metrics to TensorBoard, W&B or MLflow (the JSONL files are always written)."""

    def __post_init__(self) -> None:
        _settle(self, "")

    @property
    def world_size(self) -> int:
        return self.dist.nodes * self.dist.procs_per_node

    # --- dict / YAML -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> JobConfig:
        """Build a config from plain data; raises ConfigError listing every problem, types and values."""
        problems: list[str] = []
        with _building():
            cfg = _build(cls, data or {}, "", problems)
        problems += validate.value_problems(cfg, broken=problem_fields(problems))
        if problems:
            raise ConfigError(problems)
        return cfg

    def to_yaml(self, path: str | Path | None = None) -> str:
        import yaml

        text = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, source: str | Path, overrides: list[str] | None = None) -> JobConfig:
        """Load from a config file (a Path, or a str naming an existing file, whatever its extension)
        or from YAML text (safe and bounded: workbench.config.yamlfile).  Raises ConfigError like
        from_dict; a file that cannot be a config (missing, empty, binary, a folder, too large)
        gives one line naming the file and the fix.  `overrides` ("section.field=value", as --set)
        are applied before the one validation."""
        from workbench.config.yamlfile import YamlProblem

        path = _as_path(source)
        where = f"{shown(path)}: " if path is not None else "YAML: "
        text = read_config_file(path) if path is not None else str(source)
        try:
            data = yaml_load(text)
        except YamlProblem as exc:
            raise ConfigError([f"{where}{exc}"]) from None
        if path is not None and data is None:
            raise ConfigError([f"{shown(path)}: the file holds no settings (empty, or only comments); "
                               "write the sections you change, e.g. train: {lr: 0.001}, or {} for all defaults"])
        if data is not None and not isinstance(data, dict):
            raise ConfigError([f"{where}the top level must be a mapping of sections (task:, train:, ...), "
                               f"got {_kind(data)}"])
        if overrides:
            from workbench.config.types import apply_overrides

            data = apply_overrides(data or {}, overrides)
        return cls.from_dict(data)

    def with_overrides(self, assignments: list[str]) -> JobConfig:
        """Return a copy with "section.field=value" assignments applied (values parsed as YAML)."""
        from workbench.config.types import apply_overrides

        return JobConfig.from_dict(apply_overrides(self.to_dict(), assignments))

    def replace(self, **sections: Any) -> JobConfig:
        """Copy with whole sections or "section__field" keyword values replaced; checked like from_dict."""
        data = self.to_dict()
        for key, value in sections.items():
            section, _, name = key.partition("__")
            if name:
                data.setdefault(section, {})[name] = value  # an unknown section is reported by from_dict
            else:
                data[section] = _plain(value)
        return JobConfig.from_dict(data)

    # --- validation --------------------------------------------------------------------------
    def problems(self, gpus: int | None = None) -> list[str]:
        """Every problem with this config on its target, each naming the field and the fix (empty when
        valid): the value checks (empty for a built config) plus what the target's GPUs and Python
        can tell; `gpus` is the GPU count per node of the target (None: detect)."""
        return validate.config_problems(self, gpus)

    def check(self, gpus: int | None = None) -> JobConfig:
        """Raise ConfigError listing every problem; returns self when valid."""
        found = self.problems(gpus)
        if found:
            raise ConfigError(found)
        return self

    @staticmethod
    def docs() -> dict[str, str]:
        """Field path -> docstring, for help texts."""
        return field_docs(JobConfig)


def _plain(value: Any) -> Any:
    """A section given to replace() as plain data (a dataclass instance becomes a dict)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _as_path(source: str | Path) -> Path | None:
    """The file `source` names, or None when it is YAML text.  A Path is always a file; a str is a
    file when one exists there, or when it is one line that cannot be a YAML mapping (no ": " and no
    "{") -- a name such as "job.conf" that is missing must say so, not parse as text."""
    if isinstance(source, Path):
        return source
    text = str(source)
    if "\n" in text or "\0" in text or len(text) > 4096:
        return None
    try:
        if os.path.lexists(text):
            return Path(text)
    except (OSError, ValueError):
        return None
    mapping_like = ": " in text or text.rstrip().endswith(":") or "{" in text
    return None if mapping_like or not text.strip() else Path(text)


def read_config_file(path: Path) -> str:
    """The text of a config file, or ConfigError naming the file and the fix (missing, a folder,
    unreadable, larger than configyaml.MAX_BYTES, binary or not UTF-8)."""
    from workbench.config.yamlfile import MAX_BYTES

    name = shown(path)
    try:
        data = _read_regular(path, MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigFileError(f"{name}: no such file; check the path") from None
    except IsADirectoryError:
        raise ConfigFileError(f"{name}: is a folder, not a config file; give the YAML file in it") from None
    except OSError as exc:
        raise ConfigFileError(f"{name}: cannot read it ({exc.strerror}); check the path and its permissions") from None
    if len(data) > MAX_BYTES:
        raise ConfigFileError(f"{name}: larger than the {MAX_BYTES >> 10} KiB a config may be; is it the "
                              "right file? Keep large data in files your task factory reads")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigFileError(f"{name}: a binary file (a NUL byte at byte {nul}), not a YAML config; "
                              "give the config's .yaml file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{name}: not UTF-8 text (byte {exc.start}); give a YAML config saved as UTF-8") from None
    if not text.strip():
        raise ConfigFileError(f"{name}: the file is empty; write the sections you change, "
                              "e.g. train: {lr: 0.001}, or {} for all defaults")
    return text


def _kind(data: Any) -> str:
    return {list: "a list", str: "text", int: "a number", float: "a number", bool: "true/false"}.get(
        type(data), type(data).__name__)


# --- construction ------------------------------------------------------------------------------

_BUILDING: contextvars.ContextVar[bool] = contextvars.ContextVar("workbench_config_building", default=False)
"""True while from_dict builds the sections; it checks the whole config once, at the end."""


@contextlib.contextmanager
def _building() -> Iterator[None]:
    token = _BUILDING.set(True)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def _settle(obj: Any, path: str) -> None:
    """After __init__: coerce each field to its type, then raise ConfigError with every type and
    value problem of `obj` (a section at `path`, or the JobConfig when path is "")."""
    if _BUILDING.get():
        return
    problems = _coerce_fields(obj, path)
    broken = problem_fields(problems)
    if path:
        problems += validate.section_problems(obj, path, broken)
    else:
        problems += validate.value_problems(obj, broken)
    if problems:
        raise ConfigError(problems)


def _coerce_fields(obj: Any, path: str) -> list[str]:
    """Store each field of `obj` converted to its type (2.0 -> 2 for int); the type problems."""
    problems = []
    for name, hint in _hints(type(obj)).items():
        where, value = f"{path}.{name}" if path else name, getattr(obj, name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, hint):
                problems.append(f"{where}: expected a {hint.__name__}, got {type(value).__name__}; "
                                f"pass {hint.__name__}(...), or build the config with JobConfig.from_dict")
            continue
        ok, converted, why = coerce(value, hint)
        if ok:
            object.__setattr__(obj, name, converted)  # frozen: the one place a field is set after __init__
        else:
            problems.append(f"{where}: {why}")
    return problems


def _build(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    """Instantiate dataclass `cls` from `data`, collecting type and key problems (call inside _building)."""
    if not isinstance(data, dict):
        where = prefix.rstrip(".") or "config"
        problems.append(f"{where}: expected a mapping, got {type(data).__name__}; write its fields as key: value")
        return cls()
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(f"{prefix.rstrip('.') or 'config'}: the key {_short(key)} is not text; "
                            f"section and field names are words, e.g. {next(iter(hints))}")
            continue
        path = f"{prefix}{shown(key)}"
        if key not in hints:
            problems.append(unknown_key_message(path, key, list(hints)))
            continue
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value if value is not None else {}, f"{path}.", problems)
            continue
        ok, converted, why = coerce(value, hint)
        if ok:
            kwargs[key] = converted
        else:
            problems.append(f"{path}: {why}")
    return cls(**kwargs)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved type hint, in field order (resolved once per class: construction stays cheap)."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train.lr": 0.001, ...}: a config dict with its sections opened (option dicts kept whole)."""
    sections = {path.rsplit(".", 1)[0] for path in JobConfig.docs() if "." in path}
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        out.update(flatten(value, f"{path}.") if path in sections else {path: value})
    return out


def _read_regular(path: Path, max_bytes: int) -> bytes:
    """At most `max_bytes` of a regular file: a FIFO or a device in its place (a run folder's
    config.yaml in a shared root) is refused at once, not waited on.  The rule of
    runfolder.private.open_regular, here because config imports nothing above it."""
    import errno
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO or a device)", str(path))
        os.set_blocking(fd, True)
        return fh.read(max_bytes)
