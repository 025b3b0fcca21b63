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
same time, so a logged step costs no host sync of its own on GPU.

Records held for a reduce are never lost when the rank ends early: the monitor calls `write_held`
before it closes the metrics file on every path (a raise, SIGTERM/cancel, a peer's failure seen by
the heartbeat thread).  A record written there carries the rank's own `loss` but no `loss_reduced`
unless its reduce had already completed (a peer may never join one).  Only a rank killed outright
(SIGKILL, a crash in native code) loses what it held: at most the last `max_every` logged steps,
about `every_s` seconds of them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workbench.engine.hang import in_collective
from workbench.engine.monitor import RankMonitor

REDUCE_EVERY_S = 0.25
"""Aim for about one loss reduce per this many seconds (records appear at most about this late)."""


@dataclass
class _Reduce:
    """One loss all-reduce in flight and the records waiting for it."""

    handle: Any  # torch's async handle (dist.Work) of the all-reduce
    reduced: torch.Tensor  # [losses..., stop flag, seconds since the last reduce], summed over ranks
    local: torch.Tensor  # [losses...]: this rank's own
    records: list[dict[str, Any]]
    steps: int  # steps since the reduce before


class StepLogger:
    def __init__(self, monitor: RankMonitor, world_size: int, device: str, max_every: int = 1,
                 every_s: float = REDUCE_EVERY_S):
        self.monitor, self.world_size, self.device = monitor, world_size, device
        self.max_every, self.every_s = max(1, max_every), every_s
        self.every = 1
        """Steps between reduces: the same on every rank (derived from reduced values only)."""
        self._due = 0  # the step at or after which the next reduce starts
        self._buffer: list[tuple[dict[str, Any], torch.Tensor]] = []  # logged, not yet in a reduce
        self._pending: _Reduce | None = None
        self._lock = threading.Lock()  # the heartbeat thread may write the held records (write_held)
        self._ended = False  # write_held ran: nothing more is written
        self._stop_seen = False
        self._stop_asked = False  # asked at a step without a reduce: sent with the next one
        self._since = time.perf_counter()
        self._steps = 0  # steps since the last reduce started
        monitor.write_held = self.write_held

    def end_step(self, step: int, record: dict[str, Any] | None, loss: torch.Tensor, stop: bool) -> bool:
        """After every optimizer step (the same steps on every rank): keep a logged step's record,
        and start a reduce when one is due.  Returns whether any rank asked to stop, as of the
        previous reduce (so every rank sees it at the same step)."""
        self._steps += 1
        if not self.due(step):
            if record is not None:
                with self._lock:
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
        now = time.perf_counter()
        with self._lock:  # the records move from the buffer to the reduce with nothing in between
            if record is not None:
                self._buffer.append((record, loss_sum.detach()))
            losses = [t.float() for _, t in self._buffer]
            local = torch.stack(losses) if losses else torch.zeros(0, device=self.device)
            tail = torch.tensor([float(stop or self._stop_asked), now - self._since], device=self.device)
            reduced = torch.cat([local, tail])
            handle = dist.all_reduce(reduced, async_op=True)  # collective, awaited at the next reduce
            self._pending = _Reduce(handle, reduced, local, [r for r, _ in self._buffer], self._steps)
            self._buffer = []
        self._stop_asked = False
        self._since, self._steps = now, 0
        return stop_seen

    def poll(self) -> None:
        """Write the pending records if their reduce has completed (never blocks)."""
        if self._pending is not None and self._pending.handle.is_completed():
            self.flush()

    def flush(self) -> bool:
        """Wait for the pending reduce and write its records; returns whether a stop was asked."""
        pending = self._pending
        if pending is None:
            return self._stop_seen
        with in_collective("all_reduce (loss)"):
            pending.handle.wait()  # not under the lock: a failure path may write the records meanwhile
            values = pending.reduced.tolist()  # a host sync point on GPU: one per reduce
        with self._lock:
            if self._pending is pending:
                _fill(pending.records, pending.local.tolist(), values, self.world_size)
                self._write(pending.records)  # a signal (cancel) meanwhile leaves the rest to write_held
                self._pending = None  # only now: dropped before, a SIGTERM in _fill lost the records
        stop, elapsed = values[-2], values[-1]  # the ranks' summed seconds over `steps` steps
        self._stop_seen = self._stop_seen or stop > 0
        if pending.steps:
            per_step = elapsed / (pending.steps * self.world_size)
            self.every = max(1, min(self.max_every, int(self.every_s / per_step) if per_step > 0 else self.max_every))
        return self._stop_seen

    def finish(self) -> None:
        """Reduce and write every kept record (a collective: all ranks call it at the same step)."""
        if self._buffer:
            self.log(None, torch.zeros((), device=self.device), stop=False)
        self.flush()

    def write_held(self, mirror: bool = True) -> None:
        """Write every record not written yet, without waiting for a reduce (the rank is ending
        early: a peer may never join one), and nothing after.  Records of a completed reduce get
        `loss_reduced`; the others only this rank's `loss` (None where a GPU cannot be read without
        waiting).  `mirror`: also to the live mirrors (not from the heartbeat thread)."""
        with self._lock:
            pending, buffer = self._pending, self._buffer
            if not self._ended and pending is not None:
                _fill(pending.records, _read(pending.local), _reduced_values(pending), self.world_size)
                self._write(pending.records, mirror)
            if not self._ended and buffer:
                _fill([r for r, _ in buffer], _read(torch.stack([t.float() for _, t in buffer])), None,
                      self.world_size)
                self._write([r for r, _ in buffer], mirror)
            self._pending, self._buffer, self._ended = None, [], True

    def _write(self, records: list[dict[str, Any]], mirror: bool = True) -> None:
        """Write and drop the records one by one (under the lock): a signal between two of them
        leaves the rest for write_held, at worst one record written twice, none lost."""
        while records and not self._ended:
            if mirror:
                self.monitor.log_metrics(records[0])
            else:
                self.monitor.metrics.write(records[0])
            del records[0]


def _fill(records: list[dict[str, Any]], mine: list[float] | None, reduced: list[float] | None,
          world_size: int) -> None:
    """Put this rank's loss, and where known the mean over ranks, into each record."""
    for i, record in enumerate(records):
        record["loss"] = mine[i] if mine is not None else None
        if reduced is not None:
            record["loss_reduced"] = reduced[i] / world_size


def _read(local: torch.Tensor) -> list[float] | None:
    """This rank's losses, read without waiting: on a GPU only when its stream has nothing queued
    (a failed or hung collective may hold it), else None."""
    try:
        if local.is_cuda and not torch.cuda.current_stream(local.device).query():
            return None
        return local.tolist()
    except Exception:  # noqa: BLE001 - a broken device: the records still go out, without a loss
        return None


def _reduced_values(pending: _Reduce) -> list[float] | None:
    """The reduced values if the all-reduce has completed (never waits), else None."""
    try:
        if not pending.handle.is_completed():
            return None
        pending.handle.wait()  # completed: returns at once, or raises if it failed
        return _read(pending.reduced)
    except Exception:  # noqa: BLE001 - a failed reduce: the records keep their local loss
        return None
