"""Is this rank hung, or waiting for one that is?  Run by each rank's heartbeat thread.

A rank whose loop has made no progress (no finished step, no output) for the stall limit is
looked at where its main thread is: inside a collective (torch.distributed, DDP's reducer at the end
of backward, autograd waiting on it, or a wait the engine marked with `in_collective`: its comm hook's
and its loss reduce's waits are C calls made from workbench's own code, which no file path tells from
a rank stuck in that code) it is *waiting*; anywhere else it is *stuck* there, at its
innermost frame of the user's code.  A stuck rank whose peers wait in a collective is the hung one:
it is named with that frame, and (``dist.on_hang: fail``) the run ends with it as the cause, instead
of every rank failing at the collective's timeout minutes later in the words of a broken
connection.  Which collective comes from the flight recorder's entries the ranks write into
their statuses (engine.flight): the one the stuck rank never entered (never_entered); where every
rank waits but not in the same collective or sizes at one number, the odd rank is named (mismatch).

The stall limit, unless ``dist.stall_after_s`` fixes it (then it holds from the start, before the
first step too), comes from the job's own pace: STEP_FACTOR times the longest gap between two steps
seen so far, at least STALL_FLOOR_S; before the first step (imports, data download, compilation)
STARTUP_STALL_S, which is also the least a rank is stuck before its first step to be named hung.
A number the user set holds from the start, but before its first step a rank whose stack keeps moving
is at work, not hung: DDP's constructor alone imports some 800 modules (torch._dynamo, sympy) in 3 s
on an idle machine and in over 8 s on a loaded one, while its peers wait in the parameter broadcast.
Such a rank is named only once its stack has stood still for the limit (a loop that sleeps, a lock,
a C call that never returns), or after STARTUP_STALL_S whatever its stack does.
The innermost frame of the user's code is the innermost outside the standard library, installed
packages (site-packages) and the workbench; failing that, the innermost outside the standard
library, torch and the workbench."""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from typing import Any

from workbench.engine.flight import last_collective

STALL_FLOOR_S = 60.0
STARTUP_STALL_S = 300.0
STEP_FACTOR = 10.0
COLLECTIVE_CODE = (os.sep + os.path.join("torch", "distributed") + os.sep,
                   os.sep + os.path.join("torch", "nn", "parallel") + os.sep,
                   os.sep + os.path.join("torch", "autograd") + os.sep,
                   os.sep + os.path.join("torch", "_tensor.py"))
"""Where a main thread waiting in a collective is: c10d's calls, DDP (its reducer waits for the
gradient all-reduce at the end of backward), autograd's backward."""
_STDLIB = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_WORKBENCH = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


_waiting_in: str | None = None
"""The collective the main thread waits in, where the engine marked the wait (in_collective)."""


class in_collective:  # noqa: N801 - used as a function: `with in_collective("all_reduce"):`
    """Mark the block as a wait for the other ranks (read from the heartbeat thread by where_is).  A plain
    class, not a contextlib generator: it runs in the per-step path (the comm hook, the loss reduce)."""

    __slots__ = ("what", "outer")

    def __init__(self, what: str) -> None:
        self.what: str = what
        self.outer: str | None = None

    def __enter__(self) -> None:
        global _waiting_in
        self.outer, _waiting_in = _waiting_in, self.what

    def __exit__(self, *exc_info: object) -> None:
        global _waiting_in
        _waiting_in = self.outer


@dataclass
class Stuck:
    """Where a rank's main thread is after making no progress for `silent_s` seconds."""

    silent_s: float
    waiting: bool
    """In a collective (waiting for a peer), not in the user's own code."""
    where: str
    """Its innermost frame of the user's code: "train.py:42 in loss_fn" ("" if none)."""
    still_s: float = 0.0
    """How long its main thread's stack (the functions in it, not their lines) has not changed."""
    process: str = ""
    """Where `where` is when not in the rank's own process: " in its DataLoader worker (pid 812)"."""


class StallLimit:
    """The seconds without progress after which a rank is looked at (see the module's docstring)."""

    def __init__(self, fixed_s: float | None = None):
        self.fixed_s = fixed_s
        self.longest_gap_s = 0.0
        self._last_step: tuple[int, float] | None = None

    def saw_step(self, step: int, now: float) -> None:
        """Note the rank's step (called every beat); the gaps between steps set the limit."""
        if self._last_step is None:
            self._last_step = (step, now) if step > 0 else None
            return
        if step != self._last_step[0]:
            self.longest_gap_s = max(self.longest_gap_s, now - self._last_step[1])
            self._last_step = (step, now)

    @property
    def naming_seconds(self) -> float:
        """How long a rank must be stuck to be named hung: the limit, and before its first step
        (imports, compilation, a download while the others wait at a barrier) at least STARTUP_STALL_S,
        unless the user fixed the limit: a number they set is the limit."""
        if self.fixed_s or self._last_step is not None:
            return self.seconds
        return max(self.seconds, STARTUP_STALL_S)

    def names(self, found: Stuck) -> bool:
        """Whether a rank stuck outside a collective is stuck long enough to be named hung."""
        if found.silent_s <= self.naming_seconds:
            return False
        if self._last_step is None and found.silent_s <= STARTUP_STALL_S:
            return found.still_s > self.seconds  # before the first step a moving stack is at work
        return True

    @property
    def seconds(self) -> float:
        if self.fixed_s:
            return float(self.fixed_s)
        if self._last_step is None or not self.longest_gap_s:
            return STARTUP_STALL_S
        return max(STALL_FLOOR_S, STEP_FACTOR * self.longest_gap_s)


def main_frame() -> FrameType | None:
    """The main thread's current frame (called from another thread)."""
    return sys._current_frames().get(threading.main_thread().ident or -1)


def where_is(frame: FrameType | None) -> tuple[bool, str]:
    """(waiting in a collective, innermost frame of the user's code as "file:line in function")."""
    waiting, user, library = (True if _waiting_in is not None else None), "", ""
    while frame is not None and not user:
        name = os.path.realpath(frame.f_code.co_filename)
        if waiting is None and not _stdlib(name, frame.f_code.co_filename):
            waiting = any(part in name for part in COLLECTIVE_CODE)
        if _users(name, frame.f_code.co_filename):
            where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            user = "" if _installed(name) else where
            library = library or where
        frame = frame.f_back
    return bool(waiting), user or library


def _stdlib(name: str, raw: str) -> bool:
    return raw.startswith("<frozen ") or (name.startswith(_STDLIB) and not _installed(name))


def _installed(name: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in name or f"{os.sep}dist-packages{os.sep}" in name


def is_users(filename: str) -> bool:
    """Whether a frame's file is the user's code (what where_is names)."""
    return _users(os.path.realpath(filename), filename) and not _installed(os.path.realpath(filename))


def _users(name: str, raw: str) -> bool:
    if _stdlib(name, raw) or name.startswith(_WORKBENCH) or raw.startswith("<"):
        return False
    return (os.sep + "torch" + os.sep) not in name


def stuck(silent_s: float, limit: StallLimit, frame: FrameType | None, still_s: float = 0.0) -> Stuck | None:
    """Where the rank is, once it has made no progress for the limit; None before."""
    if silent_s <= limit.seconds:
        return None
    waiting, where = where_is(frame)
    return Stuck(silent_s, waiting, where, still_s)


def stack_shape(frame: FrameType | None) -> tuple[object, ...]:
    """The functions on a thread's stack, innermost first (their code objects: a loop that sleeps
    keeps its shape, a rank that imports or compiles changes it from one look to the next)."""
    shape = []
    while frame is not None:
        shape.append(frame.f_code)
        frame = frame.f_back
    return tuple(shape)


def hung_message(rank: int, found: Stuck, waiting_peers: list[int], which: str = "") -> str:
    """"rank 1 hung: no progress for 12 s, at train.py:42 in loss_fn; rank 0 waits for it in a collective
    (all_reduce #21, which rank 1 never entered; its last was all_reduce #20)"."""
    peers = ", ".join(map(str, waiting_peers))
    whom = f"rank {peers} waits" if len(waiting_peers) == 1 else f"ranks {peers} wait"
    at = f", at {found.where}{found.process}" if found.where else ""
    return f"rank {rank} hung: no progress for {found.silent_s:.0f} s{at}; {whom} for it in a collective{which}"


def collective_name(entry: dict[str, Any]) -> str:
    """A status's latest collective: "all_reduce #21"."""
    return f"{entry.get('collective')} #{entry.get('collective_seq')}"


def never_entered(rank: int, mine: dict[str, Any] | None, peers: dict[int, dict[str, Any]]) -> str:
    """For a rank stuck outside a collective: which collective its peers wait in and that it never
    entered it, from the flight recorder's entries in their statuses ("" when none recorded)."""
    open_ = [s for s in peers.values() if s.get("collective_seq") and s.get("collective_done") is False]
    if not open_:
        return ""
    top = max(open_, key=lambda s: int(s["collective_seq"]))
    mine_seq = int((mine or {}).get("collective_seq") or 0)
    if mine_seq >= int(top["collective_seq"]):
        return f" ({collective_name(top)})"
    last = f"; its last was {collective_name(mine)}" if mine else "; it entered none"
    return f" ({collective_name(top)}, which rank {rank} never entered{last})"


def _key(entry: dict[str, Any]) -> tuple[int, str, str]:
    return int(entry.get("collective_seq") or 0), str(entry.get("collective")), str(entry.get("collective_sizes"))


def mismatch(entries: dict[int, dict[str, Any]]) -> tuple[int, str] | None:
    """Every rank waits in a collective: where they are not in the same one (the flight recorder's
    number, op and sizes differ), the rank to name and what differs; None where all agree.  The rank
    named is the lowest outside the largest group that agrees (ties: the group of the lowest rank)."""
    keys = {rank: _key(entry) for rank, entry in sorted(entries.items())}
    if len(set(keys.values())) < 2:
        return None
    counts = Counter(keys.values())
    reference = max(counts, key=lambda k: (counts[k], -min(r for r in keys if keys[r] == k)))
    culprit = min(rank for rank in keys if keys[rank] != reference)
    seqs, ops = {k[0] for k in keys.values()}, {k[1] for k in keys.values()}
    if len(seqs) > 1:
        what = "ranks in different collectives"
    elif len(ops) > 1:
        what = f"ranks in different collectives at the same number #{reference[0]}"
    else:
        what = f"mismatched sizes in {reference[1]} #{reference[0]}"
    return culprit, f"{what}: " + "; ".join(_in(rank, entries[rank]) for rank in keys)


def _in(rank: int, entry: dict[str, Any]) -> str:
    at = f" at {entry['where']}" if entry.get("where") else ""
    return f"rank {rank} in {collective_name(entry)} of sizes {entry.get('collective_sizes')}{at}"


class HangWatch:
    """One rank's watch for a hang, beaten by its heartbeat thread: how long since its last progress
    (a step, a printed line), where its main thread is once that passes the stall limit, and whether
    peers wait for it."""

    def __init__(self, stall_after_s: float | None = None):
        self.limit = StallLimit(stall_after_s)
        self.found: Stuck | None = None
        self.named = False
        """This rank was named hung already (once per attempt)."""
        self._marker: tuple[int, int] = (-1, -1)
        self._since = 0.0
        self._shape: tuple[object, ...] = ()
        self._still_since = 0.0
        self.collective: dict[str, Any] | None = None
        """Its latest collective (engine.flight), read only once it has made no progress for the limit."""

    def beat(self, step: int, output_lines: int, now: float) -> Stuck | None:
        """Note progress; where the main thread is stuck, once it has made none for the limit."""
        self.limit.saw_step(step, now)
        if (step, output_lines) != self._marker:
            self._marker, self._since = (step, output_lines), now
        frame = main_frame()
        shape = stack_shape(frame)
        if shape != self._shape:
            self._shape, self._still_since = shape, now
        self.found = stuck(now - self._since, self.limit, frame, now - self._still_since)
        self.collective = last_collective() if self.found is not None else None
        return self.found

    def fields(self) -> dict[str, object]:
        """What the rank's status file says of it: stuck where, waiting in a collective or not, and
        `hung` once it was named hung (readers then call it hung however it ends without a word)."""
        named = {"hung": True} if self.named else {}
        if self.found is None:
            return {"waiting": False, **named}
        return {"waiting": self.found.waiting, "where": self.found.where, "stuck_s": round(self.found.silent_s, 1),
                **(self.collective or {}), **named}


def stack_text(frame: FrameType | None) -> str:
    """The main thread's stack where it is stuck, the user's frames (and what they called) only."""
    import traceback

    from workbench.engine.userframes import user_stack

    if frame is None:
        return ""
    return "Stack (most recent call last):\n" + "".join(user_stack(traceback.extract_stack(frame)).format())
