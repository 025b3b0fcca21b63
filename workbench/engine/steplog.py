"""Per-step metric records with the loss reduced across ranks, without stalling the loop.

The loss all-reduce of a logged step is started asynchronously; its record is written as soon as
the reduce has completed (checked without blocking at the next step's start, typically already
done), and at the latest when the next step is logged.  The same reduce carries a "stop" flag
(preemption), which every rank reads at the same logged step, so all ranks stop together."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from workbench.engine.monitor import RankMonitor


class StepLogger:
    def __init__(self, monitor: RankMonitor, world_size: int, device: str):
        self.monitor, self.world_size, self.device = monitor, world_size, device
        self._pending: tuple[Any, torch.Tensor, dict[str, Any] | None] | None = None
        self._stop_seen = False

    def log(self, record: dict[str, Any] | None, loss_sum: torch.Tensor, stop: bool) -> bool:
        """Start reducing this step's loss (and stop flag); returns whether any rank asked to stop,
        as of the previous call.  With record None only the flag matters: nothing is written."""
        self.flush()
        stop_seen, self._stop_seen = self._stop_seen, False
        reduced = torch.stack([loss_sum.detach().float(), torch.tensor(float(stop), device=self.device)])
        self._pending = (dist.all_reduce(reduced, async_op=True), reduced, record)
        return stop_seen

    def poll(self) -> None:
        """Write the pending record if its reduce has completed (never blocks)."""
        if self._pending is not None and self._pending[0].is_completed():
            self.flush()

    def flush(self) -> bool:
        """Wait for the pending reduce and write its record; returns whether a stop was asked."""
        if self._pending is None:
            return self._stop_seen
        work, reduced, record = self._pending
        self._pending = None
        work.wait()
        values = reduced.tolist()  # a host sync point on GPU
        if record is not None:
            record["loss_reduced"] = values[0] / self.world_size
            self.monitor.log_metrics(record)
        self._stop_seen = self._stop_seen or values[1] > 0
        return self._stop_seen
