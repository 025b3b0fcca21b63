"""Timing of DDP's gradient all-reduce, through a communication hook.

The hook wraps the all-reduce DDP would do anyway (plain, or fp16/bf16-compressed) and notes, per
step, when the last gradient bucket became ready and how long the buckets' all-reduces took.
After backward() returns:  comm_wait = backward end - last bucket ready   (exposed: the step waited)
                           comm_busy = sum of bucket all-reduce durations (may overlap compute)
On CUDA these are host-side times of asynchronous work: read them as an upper bound."""

# No "from __future__ import annotations": DDP inspects the hook's annotations at runtime.
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from workbench.engine.hang import in_collective

INNER: dict[str, Callable[..., Any]] = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


class CommTimer:
    def __init__(self, compress: str = "none"):
        self.inner = INNER[compress]
        self.busy = 0.0
        self.last_ready: float | None = None

    def take(self, backward_end: float) -> "tuple[float, float]":
        """(comm_wait_s, comm_busy_s) of the step just finished; resets for the next step."""
        wait = max(0.0, backward_end - self.last_ready) if self.last_ready is not None else 0.0
        busy, self.busy, self.last_ready = self.busy, 0.0, None
        return wait, busy


def timed_allreduce(timer: CommTimer, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    start = time.perf_counter()
    timer.last_ready = start

    def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
        timer.busy += time.perf_counter() - start
        value = fut.value()
        return value[0] if isinstance(value, list) else value

    tensor, group = bucket.buffer(), dist.group.WORLD
    if timer.inner is not default_hooks.allreduce_hook or tensor.is_complex() or group is None:
        return timer.inner(None, bucket).then(done)
    # What default_hooks.allreduce_hook does (divide by the world size, then sum), on the process
    # group itself and with one Python callback instead of two.  On CPU (gloo) the last bucket's
    # all-reduce is awaited here: no backward compute is left to overlap with it (DDP would wait for
    # it next), and `done` then runs at once in this thread instead of in gloo's, which had to take
    # the GIL for it: that hand-over was most of a Python hook's cost (~0.1-0.2 ms CPU per step).
    tensor.div_(group.size())
    work = group.allreduce([tensor])
    if bucket.is_last() and not tensor.is_cuda:
        with in_collective("all_reduce (gradients)"):
            work.wait()
    return work.get_future().then(done)


class NoTimer:
    """Stands in for CommTimer when timing is off: nothing measured, the plain hook (if any)."""

    def take(self, backward_end: float) -> "tuple[float, float]":
        return float("nan"), float("nan")


def attach(model: "torch.nn.parallel.DistributedDataParallel", compress: str, measure: bool = True) -> Any:
    """Register the all-reduce hook DDP should use; a CommTimer when measuring, else a NoTimer."""
    if not measure:
        if compress != "none":
            model.register_comm_hook(None, INNER[compress])
        return NoTimer()
    timer = CommTimer(compress)
    model.register_comm_hook(timer, timed_allreduce)
    return timer
