"""What one rank's training step holds in memory, traced on fake tensors: nothing of the model is allocated.

The task's own factory builds the model and datasets on fake tensors (planning.fake), the engine's own
optimizer (engine.optim) is built over it, and torch's MemTracker (torch.distributed._tools) follows two
training steps as the engine takes them (forward under the config's autocast, backward, clipping, the
optimizer's step with its state, zero_grad): its peak is the step's peak.  With gradient accumulation a
step takes two of its micro-batches: the second one runs with the first one's gradients held, as every
later one does.  A forward pass alone gives the activations.  DDP adds a copy of the gradients for its
buckets unless dist.gradient_as_bucket_view (the default) makes the gradients views of them, and with
accumulation even then, until the last micro-batch copies the gradients into them.  A factory
that cannot be traced (data-dependent shapes, custom ops) is built for real instead, and its memory is
then its weights, gradients and optimizer state only, which the result says."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from workbench.config.sections import JobConfig

MB = 2**20


@dataclass(frozen=True)
class StepMemory:
    """One rank's memory for a training step at `micro_batch_size`, in bytes."""

    micro_batch_size: int
    params: int
    grads: int
    optimizer: int
    activations: float
    """Held at the end of the forward pass (nan when it could not be traced)."""
    peak: float
    """The step's peak, DDP's buckets included (nan when it could not be traced)."""
    traced: bool
    note: str = ""
    """What was measured instead, when the step could not be traced."""
    fwd_bwd_peak: float = float("nan")
    """The peak of a step's forward and backward alone (the optimizer's state held, its step not taken)."""
    samples: int | None = None
    """The training set's size, as the factory built it (None: it has no length)."""
    largest_unit: int = 0
    """fsdp2: the parameter bytes of the largest unit fully_shard would make (dist.fsdp_units, or the
    model's repeated blocks, else its large children: engine.strategy.pick_units)."""
    root_only: int = 0
    """fsdp2: the parameter bytes in no unit, which the root gathers for the whole step."""
    grad_sizes: tuple[int, ...] = ()
    """The bytes of each trainable parameter's gradient, in the model's order (DDP's buckets are cut from it)."""
    unit_sizes: tuple[int, ...] = ()
    """fsdp2: the parameter bytes of each unit fully_shard would make, outermost first."""
    grad_accum_steps: int = 1
    """The config's micro-batches a step (train.grad_accum_steps)."""

    def sharded(self, world_size: int) -> float:
        """The step's peak under fsdp2 at `world_size` ranks, the largest of three moments (checked against
        torch's FSDPMemTracker on a real 2-rank run: bench/plan_bench.py):
        - backward begins: the forward-backward peak less the whole parameters, gradients (none yet) and
          optimizer state, plus their shards, the root's parameters whole and the two largest units'
          gathered (the one computing and the next, prefetched);
        - the largest unit's reduce-scatter: the shards, the other units' sharded gradients, the unit's
          unsharded gradient, the reduce-scatter's input (a copy of it) and output (its shard), the root's
          parameters, and at most all the activations (those of the layers backward has still to reach:
          the conv net's convolutions in the root, after its large Linear unit; a bound, not a trace);
        - the optimizer's step: all of it sharded, its temporaries too;
        - with gradient accumulation, a later micro-batch's backward: fsdp2 reduces no gradient before the
          step's last micro-batch (set_requires_gradient_sync(False)), so every unit's gradient is held
          whole, and the largest parameter's new gradient beside it until autograd adds it in, with two
          units gathered and the activations (measured: 9.60 MiB for the MLP of tests/ddp/test_plan_check.py
          at accumulation 2, where the moments above give 8.66)."""
        if world_size <= 1 or self.peak != self.peak:  # one rank, or not traced (nan)
            return self.peak
        n = world_size
        held = (self.params + self.optimizer) / n
        unit, root = self.largest_unit, self.root_only
        two = sum(sorted(self.unit_sizes)[-2:]) if self.unit_sizes else 2 * unit
        begins = self.fwd_bwd_peak - (self.params + self.grads + self.optimizer) + held + root + two
        scatter = held + (self.grads - unit) / n + (2 + 1 / n) * unit + root + self.activations
        accumulating = 0.0
        if self.grad_accum_steps > 1:
            accumulating = held + self.grads + max(self.grad_sizes, default=0) + root + two + self.activations
        return max(begins, scatter, accumulating, self.peak / n)

    @property
    def per_sample(self) -> float:
        """Activation bytes per sample of the micro-batch (what grows with it)."""
        return self.activations / self.micro_batch_size

    def at(self, micro_batch_size: int) -> float:
        """The peak at another micro-batch: the same weights, gradients and optimizer state, the
        activations in proportion (a model's activations grow linearly with its batch)."""
        return self.peak + (micro_batch_size - self.micro_batch_size) * self.per_sample

    def largest_batch(self, capacity: float) -> int:
        """The largest micro-batch whose peak stays within `capacity` bytes (0: not even 1)."""
        if self.per_sample != self.per_sample or self.per_sample <= 0:
            return 0
        return max(0, int((capacity - (self.peak - self.activations)) // self.per_sample))


def step_memory(cfg: JobConfig, factory: Callable[..., Any], device: str = "cpu", fake: bool = True) -> StepMemory:
    """The memory of one rank's training step of `cfg` on `device` (see the module's docstring); with
    `fake` False the same tracker follows real tensors (the measurement on CPU, which keeps no allocator
    statistics)."""
    micro = cfg.train.micro_batch_size
    try:
        return _traced(cfg, factory, device, fake)
    except Exception as exc:  # noqa: BLE001 - any factory: what cannot be traced is measured instead
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    import torch

    from workbench.engine.optim import build_optimizer
    from workbench.engine.tasks import build_task

    task = build_task(factory, dict(cfg.task.options))
    params, grads = _weights(task.model)
    optimizer = build_optimizer(task.model, cfg.train, cfg.train.lr)
    state = _optimizer_bytes_expected(optimizer, torch)
    units, root = unit_bytes(task.model, cfg.dist.fsdp_units)
    return StepMemory(micro, params, grads, state, float("nan"), float("nan"), traced=False,
                      note=f"the step could not be traced on fake tensors ({why}); weights, gradients and "
                           "optimizer state only", samples=_length(task.train_dataset),
                      largest_unit=max(units, default=0), root_only=root, grad_sizes=grad_sizes(task.model),
                      unit_sizes=units, grad_accum_steps=cfg.train.grad_accum_steps)


def unit_bytes(model: Any, names: list[str]) -> tuple[tuple[int, ...], int]:
    """(bytes of each fsdp2 unit's own parameters, outermost first; bytes of the parameters in no unit).
    A unit nested in another is the inner one's: fully_shard gives a parameter to the innermost unit."""
    from workbench.engine.strategy import pick_units

    units = pick_units(model, names)
    owner: dict[int, int] = {}
    for i, (_, unit) in enumerate(units):  # outermost first: an inner unit takes its parameters over
        for p in unit.parameters():
            owner[id(p)] = i
    sizes = [0] * len(units)
    root = 0
    for p in model.parameters():
        if id(p) in owner:
            sizes[owner[id(p)]] += p.numel() * p.element_size()
        else:
            root += p.numel() * p.element_size()
    return tuple(sizes), root


def grad_sizes(model: Any) -> tuple[int, ...]:
    """The bytes of each trainable parameter's gradient, in model.parameters() order."""
    return tuple(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an IterableDataset
        return None


def _traced(cfg: JobConfig, factory: Callable[..., Any], device: str, fake: bool = True) -> StepMemory:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.data import default_collate

    from workbench.engine.data import to_device
    from workbench.engine.memprobe import tracked_peak
    from workbench.engine.optim import build_optimizer
    from workbench.engine.strategy import clip_grad_norm
    from workbench.engine.tasks import build_task, forward_loss
    from workbench.planning.fake import fake_tensors

    micro = cfg.train.micro_batch_size
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
    kind = device.split(":")[0]
    with fake_tensors() if fake else contextlib.nullcontext():
        task = build_task(factory, dict(cfg.task.options))
        model = moved(task.model, device) if fake else task.model.to(device)
        params, grads = _weights(model)
        units, root = unit_bytes(model, cfg.dist.fsdp_units)
        optimizer = build_optimizer(model, cfg.train, cfg.train.lr)
        batch = to_device(default_collate([task.train_dataset[i] for i in range(micro)]), device)

        def forward() -> Any:
            with torch.autocast(kind, dtype=dtype, enabled=dtype is not None):
                return forward_loss(model, batch, task.loss_fn)[0]

        def tracking() -> MemTracker:
            """A fresh tracker that counts the model's and the optimizer's tensors from the start."""
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            return tracker

        with (tracker := tracking()):
            loss = forward()
            activations = tracked_peak(tracker, kind, "Activation")
            del loss
        with (tracker := tracking()):
            for _ in range(2):  # the second step with the optimizer's state, as every step after the first
                for _ in range(min(cfg.train.grad_accum_steps, 2)):  # a later micro-batch as the second
                    forward().backward()
                    tracker.reset_mod_stats()  # MemTracker refuses a module's second forward otherwise
                if cfg.train.grad_clip_norm:
                    clip_grad_norm(model, cfg.train.grad_clip_norm)  # the engine's own (its float64 sums)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        peak = tracked_peak(tracker, kind, "Total")
        with (tracker := tracking()):  # a third step's forward and backward alone: fsdp2's moments (StepMemory.sharded)
            forward().backward()
        fwd_bwd = tracked_peak(tracker, kind, "Total")
        optimizer.zero_grad(set_to_none=True)
        accumulating = fwd_bwd
        if cfg.train.grad_accum_steps > 1:  # a later micro-batch's forward and backward, the first's gradients held
            with (tracker := tracking()):
                for _ in range(2):
                    forward().backward()
                    tracker.reset_mod_stats()
            accumulating = tracked_peak(tracker, kind, "Total")
            optimizer.zero_grad(set_to_none=True)
        state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor) and t.dim() > 0)
    sizes = grad_sizes(model)
    if not cfg.dist.gradient_as_bucket_view:
        peak += grads  # DDP's buckets beside the gradients, all the time
    elif cfg.train.grad_accum_steps > 1:
        # zero_grad(set_to_none) leaves DDP's buckets allocated; the micro-batches under no_sync() make gradients
        # of their own, which the last micro-batch's backward copies into the buckets: two copies until then
        # (measured 29.93 MiB for bench/plan_bench.py's conv net at accumulation 2, where the step said 25.86)
        peak = max(peak, accumulating + grads)
    return StepMemory(micro, params, grads, int(state), activations, peak, traced=True, fwd_bwd_peak=fwd_bwd,
                      samples=_length(task.train_dataset), largest_unit=max(units, default=0), root_only=root,
                      grad_sizes=sizes, unit_sizes=units, grad_accum_steps=cfg.train.grad_accum_steps)


def _weights(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of the parameters, bytes of their gradients: the trainable ones); model.parameters() gives a
    shared (tied) one once."""
    params = list(model.parameters())
    return (sum(p.numel() * p.element_size() for p in params),
            sum(p.numel() * p.element_size() for p in params if p.requires_grad))


def _optimizer_bytes_expected(optimizer: Any, torch: Any) -> int:
    """The optimizer state a step will make, by kind (AdamW: two moments; SGD: a momentum buffer if any)."""
    per_param = 2 if isinstance(optimizer, torch.optim.AdamW) else int(bool(optimizer.defaults.get("momentum")))
    return per_param * sum(p.numel() * p.element_size() for g in optimizer.param_groups for p in g["params"])


def moved(model: Any, device: str) -> Any:
    """model.to(device) for a model of fake tensors: Module.to swaps each parameter in place, which torch
    refuses for fake ones ("Cannot swap ... weakref"), so each is replaced (a shared one once)."""
    import torch

    new: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and param.device != torch.device(device):
                if id(param) not in new:
                    new[id(param)] = torch.nn.Parameter(param.to(device), requires_grad=param.requires_grad)
                module._parameters[name] = new[id(param)]
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = buffer.to(device)
    return model

