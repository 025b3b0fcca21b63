"""Each rank's peak memory over its first training steps, measured the way the plan can be checked against
(run.plan()): on CUDA the allocator's own max_memory_allocated; on CPU, which keeps no allocator
statistics (a process's RSS holds the interpreter, torch's libraries and freed memory malloc kept), the
same tracker the plan traces with, torch's MemTracker (ddp) or FSDPMemTracker (fsdp2) from
torch.distributed._tools, following the rank's real tensors through the engine's own steps: forward,
backward with DDP's buckets or FSDP2's gathers and reduce-scatters, clip, the optimizer's step.

The first two steps of an attempt, as the plan traces two (the second holds the optimizer's state); a
fresh tracker each step.  What it found is one `memory` event per rank.  A tracker that cannot start
says why in the event and the steps run untracked: measuring never fails the user's run.
log.measure_memory: false turns it off."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from workbench.runfolder import events

STEPS = 2
"""The steps measured (the plan's trace takes two)."""
MB = 2**20


class FirstStepsMemory:
    """`with probe.step():` around each training step; the first STEPS of them are measured."""

    def __init__(self, enabled: bool, device: str, model: Any, optimizer: Any, sharded: bool, monitor: Any):
        self.left = STEPS if enabled else 0
        self.tracking = False
        self.device, self.model, self.optimizer, self.sharded, self.monitor = device, model, optimizer, sharded, monitor
        self.cuda = device.startswith("cuda")
        self.peak = 0.0
        self.first_step: int | None = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        if not self.left:
            yield
            return
        if self.first_step is None:
            self.first_step = self.monitor.step + 1
        tracker = None if self.cuda else self._start()
        if not self.cuda and tracker is None:  # said why; the rest of the steps untracked
            yield
            return
        self.tracking = tracker is not None
        try:
            yield
        finally:
            self.tracking = False
            peak = self._finish(tracker)  # never raises: a step that ran is not failed by its measurement
        if peak is None:
            return
        self.peak = max(self.peak, peak)
        self.left -= 1
        if not self.left:
            how = "max_memory_allocated" if self.cuda else type(tracker).__name__
            self.monitor.event(events.MEMORY, peak_mb=self.peak / MB, steps=[self.first_step, self.monitor.step],
                               how=how)

    def _finish(self, tracker: Any) -> float | None:
        """The step's peak bytes, the tracker left; None when that failed (the event says why)."""
        try:
            if tracker is not None:
                tracker.__exit__(None, None, None)
            return self._peak_bytes(tracker)
        except Exception as exc:  # noqa: BLE001 - measuring never fails the run: it says why it did not
            self._give_up(exc)
            return None

    def _give_up(self, exc: BaseException) -> None:
        self.left = 0
        self.monitor.event(events.MEMORY, peak_mb=None, how="not measured",
                           why=f"{type(exc).__name__}: {str(exc)[:200]}")

    def untracked(self) -> contextlib.AbstractContextManager[Any]:
        """Around fetching a batch: not the step's memory.  The plan traces the step from a batch made before
        it, and a batch a dataset hands out as views (a TensorDataset's rows) would count the whole
        dataset's storage as the step's."""
        if not self.tracking:
            return contextlib.nullcontext()
        from torch.utils._python_dispatch import _disable_current_modes

        return _disable_current_modes()

    def _start(self) -> Any:
        """A tracker entered over the model and optimizer, or None (the event says why)."""
        try:
            if self.sharded:
                from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

                tracker: Any = _lenient(FSDPMemTracker)(self.model, self.optimizer)
            else:
                from torch.distributed._tools.mem_tracker import MemTracker

                tracker = _lenient(MemTracker)()
                tracker.track_external(self.model, self.optimizer)
            tracker.__enter__()
            return tracker
        except Exception as exc:  # noqa: BLE001 - measuring never fails the run: it says why it did not
            self._give_up(exc)
            return None

    def _peak_bytes(self, tracker: Any) -> float:
        if tracker is None:
            return float(torch.cuda.max_memory_allocated(self.device))
        return tracked_peak(tracker, torch.device(self.device).type, "Total")


def _lenient(base: type) -> type:
    """`base` (torch's MemTracker or FSDPMemTracker) that lets a root module run forward again within what
    it tracks: torch's raises NotImplementedError there ("multiple iterative calls"), which inside a rank
    would fail the user's step for what is ordinary training: gradient accumulation's next micro-batch, a
    loss module called twice.  That module's own statistics start over; the peak, all this reads, is kept."""

    class Lenient(base):
        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:  # MemTracker's, for every module
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:  # raised before it changed anything
                self.memory_tracking.pop(module, None)
                super()._pre_fw_hook(module, inputs)

        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:  # FSDPMemTracker's, per unit
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            @functools.wraps(orig)
            def again(*args: Any, **kwargs: Any) -> Any:
                try:
                    return inner(*args, **kwargs)
                except NotImplementedError:  # raised before it ran FSDP's own pre-forward
                    self.memory_tracking.pop(fsdp_mod, None)
                    return inner(*args, **kwargs)

            return again

    Lenient.__name__ = base.__name__  # what the memory event's `how` says
    return Lenient


def tracked_peak(tracker: Any, kind: str, category: str) -> float:
    """A MemTracker's peak bytes of one category ("Total", "Activation") on devices of `kind`."""
    total = 0.0
    for dev, snap in tracker.get_tracker_snapshot("peak").items():
        if dev.type == kind:
            total += sum(v for k, v in snap.items() if str(getattr(k, "value", k)) == category)
    return total
