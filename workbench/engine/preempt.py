"""Preemption and time limits: checkpoint at a step boundary that every rank agrees on, then requeue.

SLURM (and submitit's local controller) send SIGUSR2 some time before the limit.  The handler
only sets a flag; the flag rides on the step log's next loss all-reduce (one for several steps, at
least every 10: engine/steplog.py), so all ranks see it at the same step, save one checkpoint
together, and stop.  Rank 0 then hands over to submitit's own
handler, which requeues the job; the next attempt resumes from that checkpoint."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNAL = signal.SIGUSR2


class PreemptionFlag:
    def __init__(self) -> None:
        self.requested = False
        self.previous: Callable[..., Any] | int | None = None

    def install(self) -> PreemptionFlag:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(SIGNAL, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def hand_over(self) -> None:
        """Give the signal to whoever handled it before us (submitit: checkpoint() and requeue)."""
        if callable(self.previous):
            signal.signal(SIGNAL, self.previous)
            self.previous(SIGNAL, None)
