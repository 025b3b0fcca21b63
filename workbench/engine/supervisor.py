"""What a rank's agent knows of the other ranks: one supervisor for the rank agent (the attempts of
a cold run, ``engine.agent``) and the pool agent (the jobs of a warm pool, ``engine.pool_agent``).

- Watching peers: a peer's error file of this attempt means a peer failed; the agent's own
  worker stops itself within a heartbeat (``engine.monitor``), and past ``PEER_EXIT_GRACE_S`` the
  agent ends it.  An error file for this rank written by its neighbour means this rank's worker
  is lost (alive but silent: hung, stopped): no use waiting for it.
- Naming: the failures of an attempt in the order they happened; the first is the cause, what
  followed (a peer's timeout, a reset connection) its consequence.
- The regroup barrier: every rank's worker is down before any starts again.  Each agent marks
  its worker down under a key (``RunDir.down_mark``); rank 0 waits for every mark, does what only
  it does once all are down (``lead``), and publishes a fresh port; the others wait for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workbench.engine.rendezvous import publish_port
from workbench.runfolder.causes import cause_of, from_record
from workbench.runfolder.layout import RunDir, read_json
from workbench.runfolder.rankstate import HEARTBEAT_S

POLL_S = 0.1
PEER_EXIT_GRACE_S = 2 * HEARTBEAT_S + 2
"""After a peer's failure a worker stops itself within a heartbeat; past this its agent ends it."""
REGROUP_TIMEOUT_S = 300.0

LOST = "lost"
"""A neighbour reported this rank's worker lost: end it at once."""
PEER_FAILED = "peer failed"
"""A peer failed and this rank's worker did not stop by itself within PEER_EXIT_GRACE_S: end it."""


class Supervisor:
    """One rank's view of its peers, for its agent.  `stopped` says whether the agent was asked
    to stop (a barrier gives up waiting then)."""

    def __init__(self, rank: int, world_size: int, stopped: Callable[[], bool]):
        self.rank, self.world_size, self.stopped = rank, world_size, stopped
        self._peer_failed_at: float | None = None

    # --- watching peers --------------------------------------------------------------------------
    def watch_anew(self) -> None:
        """A new attempt (or job): no peer has failed in it yet."""
        self._peer_failed_at = None

    def verdict(self, run: RunDir, attempt: int) -> str | None:
        """LOST, PEER_FAILED, or None (keep watching); called once per poll of the agent."""
        seen = self.failure_seen(run, attempt) if self._peer_failed_at is None else "peer"
        if seen == "lost":
            return LOST
        if seen and self._peer_failed_at is None:
            self._peer_failed_at = time.monotonic()
        if self._peer_failed_at is not None and time.monotonic() - self._peer_failed_at > PEER_EXIT_GRACE_S:
            return PEER_FAILED  # it did not stop by itself (hung, stopped)
        return None

    def failure_seen(self, run: RunDir, attempt: int) -> str | None:
        """"lost" when a neighbour reported this rank's (live but silent: hung, stopped) worker lost,
        "peer" when another rank failed in this attempt, else None."""
        seen = None
        for rank, path in run.rank_files("errors").items():
            error = read_json(path)
            if isinstance(error, dict) and error.get("attempt") == attempt:
                if rank == self.rank:
                    return "lost"
                seen = "peer"
        return seen

    # --- naming ----------------------------------------------------------------------------------
    @staticmethod
    def failures(run: RunDir) -> list[dict[str, Any]]:
        """The current attempt's error records, the cause first (workbench.runfolder.causes: the
        earliest that is not a knock-on error), then the others in time order."""
        found = {rank: e for rank, e in ((r, run.read_error(r)) for r in run.rank_files("errors")) if e is not None}
        cause = cause_of([from_record(rank, e) for rank, e in found.items()])
        if cause is None:
            return []
        order = [cause.rank, *(f.rank for f in cause.consequences)]
        return [found[rank] for rank in order if rank in found]

    # --- the regroup barrier (all ranks must reach it) ------------------------------------------
    def regroup(self, folder: RunDir, key: str, host: str,
                lead: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """Mark this rank's worker down under `key` and wait for the meeting: rank 0 waits until
        every rank's worker is down, calls `lead` and publishes a fresh port on `host` with what
        `lead` returned; the others wait for that.  The meeting's record (port, host, ...), or
        None if the agent was stopped while waiting."""
        folder.mark_down(key, self.rank)
        meeting = folder.rendezvous(key)
        if self.rank == 0:
            if not self._wait_for(folder, lambda: len(folder.ranks_down(key, self.world_size)) == self.world_size):
                return None
            publish_port(meeting, host, **lead())
        elif not self._wait_for(folder, lambda: read_json(meeting) is not None):
            return None
        found: dict[str, Any] = read_json(meeting)
        return found

    def regrouping(self, folder: RunDir, key: str) -> bool:
        """Another rank's worker is down for the meeting `key`: this rank follows."""
        return bool(folder.ranks_down(key, self.world_size) - {self.rank})

    def _wait_for(self, folder: RunDir, ready: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + REGROUP_TIMEOUT_S
        while not ready():
            if self.stopped():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: the other ranks did not come back for a restart within "
                                   f"{REGROUP_TIMEOUT_S:.0f} s (see {folder.rendezvous_folder})")
            time.sleep(POLL_S)
        return True
