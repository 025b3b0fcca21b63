"""How a rank holds the model: DDP or FSDP2, decided once when the Trainer is built.

    ddp    every rank keeps the whole model, its gradients and the optimizer state; gradients are
           all-reduced in buckets during backward (DistributedDataParallel).
    fsdp2  every rank keeps 1/world_size of each parameter, gradient and optimizer state
           (torch.distributed.fsdp.fully_shard); each unit's parameters are all-gathered for its
           forward and backward and its gradients reduce-scattered, so a model that does not fit
           one rank whole can still train.  Same losses as DDP, same config otherwise.

The Trainer calls the same few things either way (`model`, `module`, `sync`, `comm`, the state
dicts); which collectives run where is the strategy's business.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from workbench.config.sections import JobConfig
from workbench.engine.commtiming import NoTimer
from workbench.engine.commtiming import attach as attach_comm_timer
from workbench.errors import ConfigError

# Without repeated blocks, a direct child of the root holding at least this share of the
# parameters is a unit of its own (the rest stay with the root).
LARGE_CHILD_SHARE = 0.125
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DDPStrategy:
    """A whole replica a rank; DDP all-reduces gradients, timed by the comm hook when asked."""

    name = "ddp"
    sharded = False

    def __init__(self, cfg: JobConfig, module: nn.Module, device: str):
        from torch.nn.parallel import DistributedDataParallel as DDP

        d = cfg.dist
        self.module = module.to(device)
        self.model = DDP(self.module, device_ids=[device] if device.startswith("cuda") else None,
                         find_unused_parameters=d.find_unused_parameters,
                         gradient_as_bucket_view=d.gradient_as_bucket_view, static_graph=d.static_graph,
                         bucket_cap_mb=d.bucket_cap_mb)
        self.comm = attach_comm_timer(self.model, d.comm_hook, d.measure_comm)
        self.units: list[str] = []

    def sync(self, last_micro_step: bool) -> contextlib.AbstractContextManager[Any]:
        """Gradients are all-reduced only on the last micro-step: no_sync() skips the others."""
        return contextlib.nullcontext() if last_micro_step else self.model.no_sync()

    def state_dicts(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole model's and optimizer's state (every rank has them; rank 0 writes them)."""
        return self.module.state_dict(), optimizer.state_dict()


class FSDP2Strategy:
    """fully_shard on each unit (`dist.fsdp_units`, or the model's repeated blocks), then the root."""

    name = "fsdp2"
    sharded = True

    def __init__(self, cfg: JobConfig, module: nn.Module, device: str):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        module = module.to(device)
        dtype = DTYPES.get(cfg.train.precision)
        # Low-precision parameters for compute and all-gathers, fp32 gradient reduction (as torchtitan).
        policy = (MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype
                  else MixedPrecisionPolicy())
        units = pick_units(module, cfg.dist.fsdp_units)
        self.units = sorted({type(unit).__name__ for _, unit in units})  # before fully_shard renames them FSDP*
        reshard = cfg.dist.reshard_after_forward
        for _, unit in reversed(units):  # inner units before the ones holding them, the root last
            fully_shard(unit, reshard_after_forward=reshard, mp_policy=policy)
        # The root as torch's default (None) has it: not resharded after forward, since backward starts with
        # its parameters (the head); True there would all-gather them again at once, an extra collective a step.
        fully_shard(module, reshard_after_forward=None if reshard else False, mp_policy=policy)
        self.module = self.model = module
        # FSDP2's all-gathers and reduce-scatters are issued inside its own hooks (and CUDA streams):
        # not timed yet, so comm_wait_s and comm_busy_s are NaN ("not measured") under fsdp2.
        self.comm = NoTimer()

    def sync(self, last_micro_step: bool) -> contextlib.AbstractContextManager[Any]:
        """Accumulate unsharded gradients without reduce-scattering until the last micro-step."""
        self.model.set_requires_gradient_sync(last_micro_step)  # type: ignore[operator]
        return contextlib.nullcontext()

    def state_dicts(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's shards of the model's and optimizer's state, keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        return get_state_dict(self.model, optimizer)


def clip_grad_norm(module: nn.Module, max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their global L2 norm is at most `max_norm` (torch's
    clip_grad_norm_ formula); returns the norm before clipping.

    Collective under fsdp2: the squared norms of this rank's gradient shards are all-reduced.  The
    norm is summed in float64 under both strategies, so the sum's order (one whole tensor under ddp,
    shards under fsdp2) does not change the fp32 clip factor, and the two train the same losses."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    whole: list[torch.Tensor] = []
    shards: list[torch.Tensor] = []
    for p in module.parameters():
        if p.grad is not None:
            g = p.grad
            (shards if isinstance(g, DTensor) else whole).append(g.to_local() if isinstance(g, DTensor) else g)
    grads = whole + shards
    if not grads:
        return torch.zeros(())
    device = grads[0].device

    def squares(ts: list[torch.Tensor]) -> torch.Tensor:
        return sum((torch.linalg.vector_norm(t, dtype=torch.float64) ** 2 for t in ts),
                   torch.zeros((), dtype=torch.float64, device=device))

    total_sq = squares(whole)
    if shards:
        sharded_sq = squares(shards)
        dist.all_reduce(sharded_sq)  # collective: every rank's shards of every sharded gradient
        total_sq = total_sq + sharded_sq
    norm = total_sq.sqrt().float()
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(factor.to(g.device, g.dtype))
    return norm


def build_strategy(cfg: JobConfig, module: nn.Module, device: str) -> DDPStrategy | FSDP2Strategy:
    """The rank's way of holding the model, from dist.strategy."""
    kind = FSDP2Strategy if cfg.dist.strategy == "fsdp2" else DDPStrategy
    return kind(cfg, module, device)


# --- choosing fsdp2 units ----------------------------------------------------------------------------
def pick_units(module: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    """(path, module) of every unit to shard on its own, outermost first: the classes named in
    dist.fsdp_units, else the model's repeated blocks, else its large children.  A unit holding a
    parameter that is also used outside it (a tied embedding) is left to the root."""
    if names:
        problem = units_problem({type(m).__name__ for m in module.modules()}, names)
        if problem:
            raise ConfigError([problem])
        chosen: list[tuple[str, nn.Module]] = [(path, m) for path, m in module.named_modules()
                                               if path and type(m).__name__ in names]
    else:
        chosen = repeated_blocks(module) or large_children(module)
    shared = _shared_outside(module)
    return [(path, m) for path, m in chosen if not any(_owns(path, fqns) for fqns in shared)]


def units_problem(classes: Iterable[str], names: list[str]) -> str | None:
    """What is wrong with dist.fsdp_units `names` for a model whose module classes are `classes`
    (None: every name is one of them).  Said by the ranks and, before they start, by submit."""
    present = sorted(set(classes))
    missing = [n for n in names if n not in present]
    if not missing:
        return None
    return (f"dist.fsdp_units: the model has no {', '.join(missing)}; its module classes are {', '.join(present)}; "
            "list some of those, or leave it empty for its repeated blocks")


def repeated_blocks(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Instances of the non-leaf class that repeats (2+ instances) and holds the most parameters."""
    found: list[tuple[str, nn.Module]] = [(path, m) for path, m in module.named_modules()
                                          if path and any(True for _ in m.children())]
    counts = Counter(type(m) for _, m in found)
    weight: Counter[type] = Counter()
    for _, m in found:
        if counts[type(m)] >= 2:
            weight[type(m)] += sum(p.numel() for p in m.parameters())
    if not weight or not max(weight.values()):
        return []
    best = max(weight, key=lambda k: weight[k])
    return [(path, m) for path, m in found if type(m) is best]


def large_children(module: nn.Module) -> list[tuple[str, nn.Module]]:
    total = sum(p.numel() for p in module.parameters())
    return [(name, child) for name, child in module.named_children()
            if total and sum(p.numel() for p in child.parameters()) >= LARGE_CHILD_SHARE * total]


def _shared_outside(module: nn.Module) -> list[list[str]]:
    """Names of parameters reachable under more than one name (tied weights)."""
    names: dict[int, list[str]] = {}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(fqn)
    return [fqns for fqns in names.values() if len(fqns) > 1]


def _owns(path: str, fqns: list[str]) -> bool:
    """Whether the unit at `path` holds some but not all of a tied parameter's names."""
    inside = [f.startswith(path + ".") for f in fqns]
    return any(inside) and not all(inside)


def local_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(name, this rank's tensor, whether it is a shard) for every parameter and buffer."""
    from torch.distributed.tensor import DTensor

    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if isinstance(t, DTensor):
            yield name, t.to_local(), True
        else:
            yield name, t, False
