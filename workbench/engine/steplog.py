"""Per-step metric records with the loss reduced across ranks, without stalling the loop.

The ranks' losses are all-reduced asynchronously, several logged steps in one reduce: a reduce
costs about as much CPU as a small training step's Python work (on gloo ~0.1 ms per rank, most of
it in gloo's threads), so one per step was a few per cent of a fast loop.  A reduce carries the
losses of every logged step since the last one, plus a "stop" flag (preemption) that every rank
reads at the same step, so all ranks stop together, plus each rank's wall time since the last
reduce.  From that time, which after the reduce is the same number on every rank, all ranks derive
the same cadence: a reduce about every `every_s` seconds, at least every `max_every` steps (and at
every step when steps are slow).  A record is written as soon as its reduce has completed (checked
without blocking at the next step's start, typically already done), and at the latest at the next
reduce; the first step is reduced at once.  The local loss (`loss`) is read from the device at the
same time, so a logged step costs no host sync of its own on GPU."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from workbench.engine.monitor import RankMonitor

REDUCE_EVERY_S = 0.25
"""Aim for about one loss reduce per this many seconds (records appear at most about this late)."""


class StepLogger:
    def __init__(self, monitor: RankMonitor, world_size: int, device: str, max_every: int = 1,
                 every_s: float = REDUCE_EVERY_S):
        self.monitor, self.world_size, self.device = monitor, world_size, device
        self.max_every, self.every_s = max(1, max_every), every_s
        self.every = 1
        """Steps between reduces: the same on every rank (derived from reduced values only)."""
        self._due = 0  # the step at or after which the next reduce starts
        self._buffer: list[tuple[dict[str, Any], torch.Tensor]] = []  # logged, not yet in a reduce
        self._pending: tuple[Any, torch.Tensor, torch.Tensor, list[dict[str, Any]], int] | None = None
        self._stop_seen = False
        self._stop_asked = False  # asked at a step without a reduce: sent with the next one
        self._since = time.perf_counter()
        self._steps = 0  # steps since the last reduce started

    def end_step(self, step: int, record: dict[str, Any] | None, loss: torch.Tensor, stop: bool) -> bool:
        """After every optimizer step (the same steps on every rank): keep a logged step's record,
        and start a reduce when one is due.  Returns whether any rank asked to stop, as of the
        previous reduce (so every rank sees it at the same step)."""
        self._steps += 1
        if not self.due(step):
            if record is not None:
                self._buffer.append((record, loss.detach()))
            self._stop_asked = self._stop_asked or stop
            return False
        stop_seen = self.log(record, loss, stop)
        self._due = step + self.every
        return stop_seen

    def due(self, step: int) -> bool:
        """Whether end_step(step, ...) starts a reduce (the same answer on every rank)."""
        return step >= self._due

    def log(self, record: dict[str, Any] | None, loss_sum: torch.Tensor, stop: bool) -> bool:
        """Start reducing this step's loss (and stop flag) with every kept record's; returns
        whether any rank asked to stop, as of the previous call.  With record None only the flag
        (and the kept records) matter.  A collective: every rank calls it at the same step."""
        stop_seen = self.flush()  # the previous reduce: its verdict and the cadence it implies
        self._stop_seen = False
        if record is not None:
            self._buffer.append((record, loss_sum.detach()))
        records, losses = [r for r, _ in self._buffer], [t.float() for _, t in self._buffer]
        self._buffer = []
        now = time.perf_counter()
        local = torch.stack(losses) if losses else torch.zeros(0, device=self.device)
        tail = torch.tensor([float(stop or self._stop_asked), now - self._since], device=self.device)
        self._stop_asked = False
        reduced = torch.cat([local, tail])
        self._since, steps, self._steps = now, self._steps, 0
        self._pending = (dist.all_reduce(reduced, async_op=True), reduced, local, records, steps)
        return stop_seen

    def poll(self) -> None:
        """Write the pending records if their reduce has completed (never blocks)."""
        if self._pending is not None and self._pending[0].is_completed():
            self.flush()

    def flush(self) -> bool:
        """Wait for the pending reduce and write its records; returns whether a stop was asked."""
        if self._pending is None:
            return self._stop_seen
        work, reduced, local, records, steps = self._pending
        self._pending = None
        work.wait()
        values, mine = reduced.tolist(), local.tolist()  # host sync points on GPU: one per reduce
        for i, record in enumerate(records):
            record["loss"], record["loss_reduced"] = mine[i], values[i] / self.world_size
            self.monitor.log_metrics(record)
        stop, elapsed = values[-2], values[-1]  # the ranks' summed seconds over `steps` steps
        self._stop_seen = self._stop_seen or stop > 0
        if steps:
            per_step = elapsed / (steps * self.world_size)
            self.every = max(1, min(self.max_every, int(self.every_s / per_step) if per_step > 0 else self.max_every))
        return self._stop_seen

    def finish(self) -> None:
        """Reduce and write every kept record (a collective: all ranks call it at the same step)."""
        if self._buffer:
            self.log(None, torch.zeros((), device=self.device), stop=False)
        self.flush()
