"""Why a run failed: the one rule that picks the cause among what went wrong, for every reader
(``Run.exception``, ``Run.failures``, ``workbench show``, the dashboard, the CLI's summary).

The first failure is the cause; what follows from it is a consequence.  When one rank raises, is
killed or hangs, the others fail too, a moment later and in the collective's words: "Connection
reset by peer", "Connection closed by peer", a gloo or NCCL timeout, a communicator aborted, a rank
that stopped itself because a peer failed.  Those words are never the cause while a failure of
another kind is on record in the same attempt: a rank that is gone is dated by its last sign of life
(its heartbeat, or the moment its agent last saw it alive), which may be just after a peer's
knock-on error was written.  Every failure of the attempt stays listed, each with its rank and
attempt, after the cause.  Pure Python, no imports beyond the standard library and the run folder's
records: the ranks and the notebook read the same."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

KNOCK_ON = re.compile(
    r"connection (reset|closed) by peer|broken pipe|remote worker crash|pair closure|timed out waiting|"
    r"collective operation timeout|watchdog caught|communicator (was|has been) aborted|socket timeout|"
    r"process ?group (has been |was |is )?(aborted|destroyed|shut ?down)|stopped because rank \d+|"
    r"waiting for rank \d+", re.IGNORECASE)
"""What a rank says when a peer stopped under it (gloo, NCCL, the store, the workbench's own words)."""
KNOCK_ON_TYPES = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError", "Aborted"})
PROCESS_KINDS = frozenset({"Lost", "Hung", "Exited", "Aborted", "ControllerLost"})
"""Failures that are not an exception the rank raised: its process died, hung or stopped."""


@dataclass
class RankFailure:
    rank: int
    """The failed rank; -1 for a process that is no rank (the local controller)."""
    type: str
    message: str
    traceback: str
    host: str = ""
    attempt: int = 0
    """The attempt that failed (0, then 1, ... after each restart or requeue)."""
    time: float = 0.0
    """When it failed: the error's time, or the last sign of life of a rank that is gone."""
    reported_by: str = ""
    """Who wrote it down when the rank itself could not: "agent", "controller", "rank N", "reader"."""
    where: str = ""
    """For a hung rank: its current user frame, "file:line in function"."""
    consequences: list[RankFailure] = field(default_factory=list)
    """Every other failure of the same attempt, in time order (the cause's knock-on effects, and
    errors that came after it)."""

    @property
    def knock_on(self) -> bool:
        """Said in the words of a collective broken by someone else (never the cause when another
        kind of failure is on record)."""
        return self.type in KNOCK_ON_TYPES or bool(KNOCK_ON.search(self.message))

    @property
    def who(self) -> str:
        if self.rank < 0:
            return "the local controller"
        facts = ", ".join(x for x in (self.host, f"attempt {self.attempt}") if x)
        return f"rank {self.rank} ({facts})"

    def __str__(self) -> str:
        if self.rank < 0:  # the controller's record names it ("the local controller (pid N) was killed ...")
            return self.message or f"{self.who}: {self.type}"
        if self.type in PROCESS_KINDS:
            return f"{self.who}: {self.message}"
        return f"{self.who} raised {self.type}: {self.message}"

    def consequence_lines(self) -> list[str]:
        """One line per failure that followed the cause: "then rank 0 (...) raised RuntimeError: ..."."""
        return [f"then {_one_line(str(f))}" + (" (a consequence)" if f.knock_on else "")
                for f in self.consequences]

    def summary(self) -> str:
        """The cause's line, then a line per failure that followed it."""
        return "\n".join([str(self), *(f"  {line}" for line in self.consequence_lines())])


USER_ERROR_TYPES = frozenset({"ConfigError", "ConfigFileError", "RunFolderError"})
DISK_FULL_FIX = "free some space, or set launch.run_root to a folder on another disk"


def user_fix(failure: RankFailure) -> str | None:
    """What to do when a run failed for a reason of the user's input or environment, which every
    command says in one line and exits 2 for (a full disk; a config problem a rank found: its
    message names the fix); None for any other failure (the user's code raised, a crash, a bug)."""
    if "disk full" in failure.message:
        return DISK_FULL_FIX
    if failure.type in USER_ERROR_TYPES:
        return ""
    return None


def _one_line(text: str, limit: int = 300) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[:limit] + " ..."


def from_record(rank: int, record: dict[str, Any]) -> RankFailure:
    """A failure from an error file's record (workbench.runfolder.failures.error_record), dated by
    the last sign of life when the record says the rank was already gone (`last_seen`)."""
    when = record.get("last_seen") or record.get("time") or 0.0
    reporter = record.get("reported_by")
    return RankFailure(
        rank=int(record.get("rank", rank)), type=str(record.get("type") or "UnknownError"),
        message=str(record.get("message") or ""), traceback=str(record.get("traceback") or ""),
        host=str(record.get("host") or ""), attempt=int(record.get("attempt") or 0), time=float(when),
        reported_by=(f"rank {reporter}" if isinstance(reporter, int) else str(reporter or "")),
        where=str(record.get("where") or ""))


def cause_of(failures: list[RankFailure]) -> RankFailure | None:
    """The cause of one attempt's failures, carrying every other one as its consequences: the
    earliest failure that is not a knock-on error, else the earliest of all."""
    if not failures:
        return None
    ordered = sorted(failures, key=lambda f: (f.time, f.rank))
    cause = next((f for f in ordered if not f.knock_on), ordered[0])
    return replace(cause, consequences=[replace(f, consequences=[]) for f in ordered if f is not cause])


def stopped_because(cause: RankFailure, rank: int, waiting: bool, host: str = "", attempt: int = 0,
                    when: float = 0.0) -> RankFailure:
    """A rank that stopped itself because of the cause (no error of its own): a consequence."""
    if cause.rank < 0:
        message = "stopped because the local controller was lost"
    elif waiting:
        message = f"waiting for rank {cause.rank} in a collective; stopped because rank {cause.rank} failed"
    else:
        message = f"stopped because rank {cause.rank} failed"
    return RankFailure(rank, "Aborted", message, "", host, attempt, when)
