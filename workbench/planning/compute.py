"""One micro-batch's compute, timed on real tensors in the planning process with the rank's thread count.

What is timed is what a rank does for a micro-batch apart from communication and the engine's
bookkeeping: the next batch from the engine's own training loader (train_loader, as configured), moved
to the device, forward under the config's autocast, backward, and per step the gradient clip (the
engine's clip_grad_norm), the optimizer's step and zero_grad.  A few warm-up steps first (the
allocator, autograd's first graph, the optimizer's state), then the median of as many steps as fit in
`budget_s` (at least `least`, at most `most`): on a shared machine a single step varies by tens of
percent, a median of many much less."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.config.sections import JobConfig


def median_seconds(step: Callable[[], None], warmup: int = 3, least: int = 5, most: int = 30,
                   budget_s: float = 1.5, sync: Callable[[], None] = lambda: None) -> float:
    """The median wall time of `step()` after `warmup` calls: at least `least` timed calls, then more
    until `budget_s` is spent or `most` were timed.  `sync` waits for the device (CUDA) before a clock."""
    for _ in range(warmup):
        step()
    sync()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < least or (len(times) < most and time.perf_counter() - began < budget_s):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def micro_batch_seconds(cfg: JobConfig, factory: Callable[..., Any], device: str, threads: int,
                        budget_s: float = 1.5) -> float:
    """The compute of one micro-batch and its share of the optimizer step (see the module's docstring)."""
    import torch

    from workbench.engine.tasks import build_task

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        task = build_task(factory, dict(cfg.task.options))
        step = training_step(cfg, task, task.model.to(device), device)
        sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
        return median_seconds(step, budget_s=budget_s, sync=sync)
    finally:
        torch.set_num_threads(before)


def training_step(cfg: JobConfig, task: Any, model: Any, device: str) -> Callable[[], None]:
    """A rank's step of one micro-batch without DDP: data, forward, backward, clip, optimizer step."""
    import torch

    from workbench.engine.data import endless, to_device, train_loader
    from workbench.engine.optim import build_optimizer
    from workbench.engine.strategy import clip_grad_norm
    from workbench.engine.tasks import forward_loss

    t = cfg.train
    kind = device.split(":")[0]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
    optimizer = build_optimizer(model, t, t.lr)
    loader = train_loader(task.train_dataset, cfg.data, t.micro_batch_size, 0, 1, t.seed, device)

    found = endless(loader, t.seed, 0)  # a short dataset: the next epoch, as the rank would

    def step() -> None:
        batch = to_device(next(found), device)
        with torch.autocast(kind, dtype=dtype, enabled=dtype is not None):
            loss = forward_loss(model, batch, task.loss_fn)[0]
        loss.backward()
        if t.grad_clip_norm is not None:
            clip_grad_norm(model, t.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
