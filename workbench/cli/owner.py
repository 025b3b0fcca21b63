"""A terminal command that starts a run owns it: SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal
closed) cancel the run, and so does an error in the command's own follow loop; the command ends with
a one-line report, not a traceback.  If the command is killed outright (SIGKILL), the kernel stops
the run's controller for it (``submit(stop_with_caller=True)``).  ``--detach`` leaves the run alone."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CANCEL_WAIT_S = 60.0


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the command (its number is `signum`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_pending: list[int] = []
"""Stop signals received and not yet raised (see _defer)."""


def _defer(signum: int, frame: FrameType | None) -> None:
    """Note the signal; `check_stop` raises it at the command's next safe point (its poll, at most
    half a second away).  Raising from the handler itself would interrupt whatever the main thread
    was doing, an import included, and leave a half-made module behind for the cancel that follows
    ("cannot import name ... from partially initialized module": seen once under load)."""
    _pending.append(signum)


def check_stop() -> None:
    """Raise Interrupted for a stop signal received since the command armed them (once: the
    caller that catches it has handled it)."""
    if _pending:
        signum = _pending[0]
        _pending.clear()
        raise Interrupted(signum)


def _note(signum: int, frame: FrameType | None) -> None:
    _say(f"[workbench] {signal.Signals(signum).name} again: still stopping the run")


def _handled(sig: int) -> bool:
    """Whether the command answers `sig`: SIGINT always (a shell starts a background job, `cmd &` in
    a script, with SIGINT ignored, yet Ctrl-C or `kill -INT` is meant to stop it, as it stops
    torchrun); SIGTERM and SIGHUP unless the command was started ignoring them (`nohup workbench run
    ...` survives the terminal)."""
    return sig == signal.SIGINT or signal.getsignal(sig) != signal.SIG_IGN


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread while inside, at its safe
    points (`check_stop`, and leaving the block); see `_handled` for a signal started ignored."""
    _pending.clear()
    previous = {sig: signal.signal(sig, _defer) for sig in STOP_SIGNALS if _handled(sig)}
    try:
        yield
        check_stop()  # one that came as the block ended is not lost
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _pending.clear()


def cancel_owned(run: Any, why: str) -> Any:
    """Cancel `run` because its owner is stopping; further signals only say it is in progress.
    Returns the final status (or None if the ranks did not all stop in time)."""
    for sig in STOP_SIGNALS:
        if _handled(sig):
            signal.signal(sig, _note)
    _say(f"[workbench] {why}: cancelling the run (every rank stops; checkpoints and metrics stay)")
    where = f"the workbench command (pid {os.getpid()})"
    run.cancel(by=f"{why} to {where}" if why.startswith("SIG") else f"{why} in {where}")
    try:
        return run.wait(timeout=CANCEL_WAIT_S)
    except TimeoutError:
        return None


def print_detached(run: Any) -> None:
    print(f"[workbench] run folder: {run.folder}\n"
          f"[workbench] detached: the run goes on without this command\n"
          f"  follow it:  workbench follow {run.folder}   (status: workbench show {run.folder})\n"
          f"  cancel it:  workbench cancel {run.folder}", flush=True)


def _say(text: str) -> None:
    with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
        print(text, file=sys.stderr, flush=True)
