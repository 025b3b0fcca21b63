"""What a rank tells the outside world: metrics and events (JSONL), heartbeat, error file.

A background heartbeat thread rewrites the rank's status file every few seconds with its state and
current step, and watches for another rank's error file: when a peer has failed, this rank stops
at once instead of waiting in a collective until the process-group timeout.  The main thread's
checkpoint writes hold a lock, so a rank is never stopped half-way through saving.  When no step
has finished for `stall_after_s`, the thread dumps every thread's Python stack of this rank into
the run folder (faulthandler) and reports the rank as stalled: a hang shows where it hangs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from workbench.config.sections import DistConfig
from workbench.engine import loaderstacks, stopsignal
from workbench.engine.flight import last_collective
from workbench.engine.hang import (
    HangWatch,
    Stuck,
    collective_name,
    hung_message,
    is_users,
    main_frame,
    mismatch,
    never_entered,
    stack_text,
    where_is,
)
from workbench.engine.mirrors import NoMirrors
from workbench.engine.userframes import user_traceback
from workbench.proctree import Proc
from workbench.runfolder import events
from workbench.runfolder.causes import KNOCK_ON, KNOCK_ON_TYPES
from workbench.runfolder.failures import describe, error_record, port_taken, write_error
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.private import replacing
from workbench.runfolder.rankstate import ACTIVE, HEARTBEAT_S, is_lost, lost_message, node_name, process_there
from workbench.runfolder.writer import JsonlWriter

PEER_FAILED_EXIT_CODE = 75
PORT_TAKEN_EXIT_CODE = 77
"""Rank 0 found the meeting port taken before the ranks met: its agent meets the others on a fresh one."""
PORT_RETRY_ENV = "WORKBENCH_PORT_RETRY"
"""Set by the agent while a taken port may be retried: such a failure is then not recorded."""
KNOCK_ON_GRACE_S = 2.0
"""How long a rank whose collective broke under it waits for the failure of the peer that broke it
to be on record (then it stops as aborted because of that peer, not as a failure of its own)."""
PEER_POLL_S = 0.25
"""How often a rank looks for a peer's failure (its error file) between heartbeats."""
BUSY_CPU_FRACTION = 0.05
"""A rank using more than this share of a core between heartbeats is working, not stalled."""


def _clip(text: str, limit: int = 200_000) -> str:
    """A message or traceback cut to `limit` characters (a tensor's repr can be megabytes)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}\n[... {len(text) - limit} characters cut ...]\n{text[-limit // 2:]}"


def _ignore(kind: str, **fields: Any) -> None:
    return None


def _write_nothing(mirror: bool) -> None:
    return None


def announce_starting(run: RunDir, rank: int, attempt: int = 0) -> None:
    """Say "starting" as soon as the rank's process runs, before it imports torch and meets the
    others (seconds): readers stop calling it pending.  RankMonitor's heartbeat takes over; a rank
    that dies before then is seen as lost by the usual liveness rule."""
    write_json_atomic(run.status(rank), {"rank": rank, "state": "starting", "step": 0, "time": time.time(),
                                         "pid": os.getpid(), "host": node_name(), "attempt": attempt})


class RankMonitor:
    def __init__(self, run: RunDir, rank: int, world_size: int, attempt: int = 0, heartbeat_s: float = HEARTBEAT_S,
                 stall_after_s: float | None = DistConfig.stall_after_s, lost_after_s: float = DistConfig.lost_after_s,
                 on_hang: str = DistConfig.on_hang):
        self.run, self.rank, self.world_size, self.attempt = run, rank, world_size, attempt
        self.metrics = JsonlWriter(run.metrics(rank))
        self.events = JsonlWriter(run.events(rank))
        self.run_event = self.event if rank == 0 else _ignore
        """For findings about the whole run that every rank computes alike (a sync check, the shard
        check): rank 0 records them, the other ranks' calls do nothing (the role is fixed here)."""
        self.mirrors: Any = NoMirrors()
        """Live copies of the metrics (engine.mirrors, from the `log` config section)."""
        self.write_held: Callable[[bool], None] = _write_nothing
        """Writes the metric records held for a loss reduce (engine.steplog), before the metrics
        file closes on every path: the end, a raise or an interruption (the main thread, to the
        mirrors too), a peer's failure (_abort, the heartbeat thread: the file only)."""
        self.step = 0
        self.state = "starting"
        self.in_sync: bool | None = None
        self.hang = HangWatch(stall_after_s)
        """The stall limit (dist.stall_after_s, else the job's pace) and where this rank is stuck."""
        self.on_hang = on_hang
        self.lost_after_s = lost_after_s
        """dist.lost_after_s: a neighbour silent this long is reported lost (readers use the same)."""
        self.stalled = False
        """No step, output or CPU work for the stall limit (its stacks dumped): said in its status with
        `stalled_since`, its last progress, and where it is stuck (HangWatch.fields)."""
        self._pid_start = getattr(Proc.of(os.getpid()), "start", 0)
        """Its process's start time: a reader on its node tells this process from a later one with its pid."""
        self._progress: tuple[Any, float] = ((0, 0), time.time())  # (step, output) and when first seen
        self._cpu_seen = time.process_time()
        self.output_seen = 0  # lines the rank printed (script mode counts them); output is progress
        self.saving = threading.Lock()
        self.failing = False
        """The main thread is recording this rank's own failure: a peer's must not stop it half way."""
        self.hang_reported = False
        """This rank wrote its error file as hung (dist.on_hang fail): the cause, whatever it raises after."""
        self._recording = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat_s = heartbeat_s
        self._thread = threading.Thread(target=self._beat, name="workbench-heartbeat", daemon=True)
        run.error(rank).unlink(missing_ok=True)  # a requeued attempt starts clean

    def start(self) -> RankMonitor:
        loaderstacks.arm()  # before any DataLoader forks its workers: they inherit the dump handler
        self.write_status()
        self._thread.start()
        return self

    def event(self, kind: str, **fields: Any) -> None:
        self.events.write({"event": kind, "rank": self.rank, "step": self.step, "time": time.time(),
                           "attempt": self.attempt, **fields})
        if kind == events.EVAL:
            self.mirrors.log({"step": self.step, **fields})

    def log_metrics(self, record: dict[str, Any]) -> None:
        """One logged step: into metrics/rank{R}.jsonl, then to the live mirrors (if any)."""
        self.metrics.write(record)
        self.mirrors.log(record)

    def write_status(self) -> None:
        write_json_atomic(self.run.status(self.rank), {
            "rank": self.rank, "state": self.state, "step": self.step, "time": time.time(),
            "pid": os.getpid(), "host": node_name(), "attempt": self.attempt,
            "pid_start": self._pid_start, "stalled": self.stalled, "in_sync": self.in_sync,
            "output_lines": self.output_seen, **self.hang.fields(),
            **({"stalled_since": self._progress[1]} if self.stalled else {}),
        })

    def set_state(self, state: str) -> None:
        self.state = state
        self.write_status()

    def fail(self, exc: BaseException) -> str:
        """Record this rank's exception and traceback (error file, event, status): the user's frames
        first (traceback_full has them all); a full disk is named as such, and recorded even then
        (workbench.runfolder.failures.write_error).  A peer's failure seen meanwhile does not stop
        this rank before its own is recorded: every rank that raised keeps its error.  A collective
        broken under this rank by a peer that failed ends it as aborted; by a peer that was stopped (a
        cancel) or while this rank is stopped itself, it is recorded as interrupted, as is anything
        raised once this rank got its stop signal (stopsignal.received): returns why ("" for a failure)."""
        if os.environ.get(PORT_RETRY_ENV) and port_taken(exc) and not self.step:
            with self._recording:
                self.failing = True
            return ""  # not a failure yet: the agents meet again on a fresh port (worker: PORT_TAKEN_EXIT_CODE)
        why, peers = ("Terminated", []) if stopsignal.received is not None else self._broken_under(exc)
        if peers:
            self._abort(peers)  # stopped because of a peer, as if this rank had seen its failure first
        if why:
            with contextlib.suppress(OSError):
                self.event(events.INTERRUPTED, reason=why)
            return why
        with self._recording:  # _abort waits for it, then leaves the ending to this thread
            self.failing = True
            full = "".join(traceback.format_exception(exc))
            kind, message = describe(exc)
            if not self.hang_reported:
                write_error(self.run, self.rank, error_record(
                    self.rank, kind, _clip(message), _clip(user_traceback(exc)), self.attempt, node_name(),
                    self.step, traceback_full=_clip(full)))
        with contextlib.suppress(OSError):  # the disk may be full
            # After this rank named itself hung, what it raises is what the hang led to (a peer that stopped
            # closed the connection it waited on): the hang stays its cause, the exception an event.
            self.event(events.ERROR, type=kind, message=_clip(message, 2000),
                       **({"after": "Hung"} if self.hang_reported else {}))
            self.set_state("failed")
        return ""

    @contextlib.contextmanager
    def reporting(self) -> Iterator[RankMonitor]:
        """Record how the body ended: interrupted (cancel, preemption exit) or failed (with traceback)."""
        try:
            yield self
        except (KeyboardInterrupt, SystemExit) as exc:
            self.event(events.INTERRUPTED, reason=type(exc).__name__)
            self.close("interrupted")
            raise
        except BaseException as exc:
            stopped = self.fail(exc)
            self.close("interrupted" if stopped else None)
            raise

    def close(self, state: str | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)  # a beat in flight must not overwrite the final state
        with contextlib.suppress(Exception):  # a crash never loses logged metrics
            self.write_held(True)
        with contextlib.suppress(Exception):  # a mirror must never stop a rank from ending cleanly
            self.mirrors.close()
        with contextlib.suppress(OSError):  # a full disk: what could be recorded was
            if state:
                self.set_state(state)
        for writer in (self.metrics, self.events):
            with contextlib.suppress(OSError):
                writer.close()

    def _broken_under(self, exc: BaseException) -> tuple[str, list[int]]:
        """Whether `exc`, in the words of a collective broken by someone else, came of a peer's end:
        ("", peers) when a peer's failure of this attempt is on record, now or within
        KNOCK_ON_GRACE_S (a peer whose process ended at once closed the connection before this rank's
        monitor saw its error file); (why, []) when the run was cancelled, or this rank was asked to
        stop meanwhile (its own SIGTERM lands after its peer's made that peer leave); ("", []) else."""
        if self.hang_reported:
            return "", []  # this rank's hang is the cause; what it raises now is what the hang led to
        kind, message = describe(exc)
        if kind not in KNOCK_ON_TYPES and not KNOCK_ON.search(message):
            return "", []
        deadline = time.monotonic() + KNOCK_ON_GRACE_S
        try:
            while True:
                peers = self.failed_peers()
                if peers:
                    return "", peers
                if (self.run.read_meta() or {}).get("cancelled"):
                    return "cancelled", []
                if time.monotonic() >= deadline:
                    return "", []
                time.sleep(0.05)
        except KeyboardInterrupt as stop:  # SIGTERM, SIGHUP (worker.Terminated) or Ctrl-C meanwhile
            return type(stop).__name__, []

    def failed_peers(self) -> list[int]:
        """Other ranks with an error file of this attempt."""
        found = []
        for rank in self.run.rank_files("errors"):
            error = self.run.read_error(rank)
            if rank != self.rank and isinstance(error, dict) and error.get("attempt", self.attempt) == self.attempt:
                found.append(rank)
        return found

    def _beat(self) -> None:
        """Every heartbeat: progress, hang, status, neighbour; every PEER_POLL_S: a peer's failure
        (this rank then stops within a fraction of a second, not a heartbeat later)."""
        next_beat = time.monotonic() + self._heartbeat_s
        while not self._stop.wait(min(PEER_POLL_S, self._heartbeat_s)):
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self._heartbeat_s
                self._watch_progress()
                with contextlib.suppress(OSError):  # a full disk: the main thread reports it
                    self._watch_hang()
                    self.write_status()
                    self._watch_neighbour()
            peers = self.failed_peers()
            if peers and not self._stop.is_set() and not self.failing:
                self._abort(peers)

    def _watch_progress(self, now: float | None = None) -> None:
        """Stalled: no finished step, no output and (almost) no CPU work for stall_after_s.  A rank
        that computes or prints is alive even if it logs no step; one waiting in a collective for a
        hung peer uses next to no CPU."""
        now = now or time.time()
        cpu = time.process_time()
        working = cpu - self._cpu_seen > BUSY_CPU_FRACTION * self._heartbeat_s
        self._cpu_seen = cpu
        marker = (self.step, self.output_seen)
        if marker != self._progress[0] or working:
            self._progress, self.stalled = (marker, now), False
        elif self.state == "running" and not self.stalled and now - self._progress[1] > self.hang.limit.seconds:
            self.stalled = True
            self.dump_stacks()
            self.event(events.STALLED, silent_s=round(now - self._progress[1], 1),
                       stacks=str(self.run.stacks(self.rank)))

    def _watch_neighbour(self, now: float | None = None) -> None:
        """Each rank watches the next one's heartbeat (a ring: one file read per beat whatever the
        world size).  A neighbour silent for lost_after_s is reported lost with an error file, which
        every rank sees: the run stops instead of waiting out the process-group timeout (NCCL
        notices a vanished peer only then)."""
        peer = (self.rank + 1) % self.world_size
        if peer == self.rank or self.run.error(peer).exists():
            return
        data = self.run.read_status(peer)  # None when absent or damaged: then it proves nothing
        silent = (now or time.time()) - data["time"] if data else 0.0
        if data and data.get("state") in ACTIVE and is_lost(silent, self.lost_after_s, data["state"]):
            message = lost_message(peer, silent, noticed_by=self.rank, there=process_there(data)) + self._waits_in()
            write_error(self.run, peer, error_record(peer, "Lost", message,
                                                     "", self.attempt, data.get("host", ""), data.get("step"),
                                                     reported_by=self.rank, last_seen=data["time"]))

    def _waits_in(self) -> str:
        """"; rank 0 waits for it in all_reduce #21 at train.py:40 in step", where this rank's flight
        recorder has a collective it entered and that has not completed (engine.flight)."""
        mine = last_collective()
        if not mine or mine.get("collective_done") is not False:
            return ""
        where = where_is(main_frame())[1]
        return f"; rank {self.rank} waits for it in {collective_name(mine)}" + (f" at {where}" if where else "")

    def _watch_hang(self, now: float | None = None) -> None:
        """A rank stuck outside a collective for the stall limit while a peer waits in one is hung:
        named once, with where it is stuck and the collective it never entered (engine.hang,
        engine.flight); ranks that all wait, but in different collectives (or sizes) at the same
        number, name the odd one.  dist.on_hang=fail ends the run with it as the cause (its error
        file: every rank stops, its agent ends it)."""
        found = self.hang.beat(self.step, self.output_seen, now or time.time())
        if found is None or self.state != "running" or self.hang.named:
            return
        if not self.hang.limit.names(found):
            return  # before its first step: imports, compilation, a download while the others wait
        peers = self._waiting_peers()
        if found.waiting:
            self._watch_mismatch(found, peers)
        elif peers:
            found = self._in_loader_worker(found)
            which = never_entered(self.rank, self.hang.collective, peers)
            self._name_hung(hung_message(self.rank, found, sorted(peers), which), found, sorted(peers))

    def _in_loader_worker(self, found: Stuck) -> Stuck:
        """Where its DataLoader worker is stuck, when its main thread waits for one (engine.loaderstacks)."""
        worker = loaderstacks.stuck_worker(main_frame(), is_users)
        if worker is None:
            return found
        return dataclasses.replace(found, where=worker[1], process=f" in its DataLoader worker (pid {worker[0]})")

    def _watch_mismatch(self, found: Stuck, peers: dict[int, dict[str, Any]]) -> None:
        """Every rank waits in a collective: named where their flight recorders disagree (number, op, sizes)."""
        mine = self.hang.collective
        if len(peers) != self.world_size - 1 or not mine or mine.get("collective_done"):
            return
        entries = {**peers, self.rank: {**mine, "where": found.where}}
        if any(not e.get("collective_seq") or e.get("collective_done") is not False for e in entries.values()):
            return
        verdict = mismatch(entries)
        if verdict is None or verdict[0] != self.rank:
            return  # all in the same collective (a lost peer is the neighbour's to name), or another's to name
        others = sorted(peers)
        message = f"rank {self.rank} hung: no progress for {found.silent_s:.0f} s, {verdict[1]}"
        self._name_hung(message, found, others)

    def _name_hung(self, message: str, found: Stuck, waiting: list[int]) -> None:
        self.hang.named = True
        self.dump_stacks()
        which = {"collective": collective_name(self.hang.collective)} if self.hang.collective else {}
        self.event(events.HUNG, message=message, where=found.where, waiting_ranks=waiting,
                   silent_s=round(found.silent_s, 1), **which)
        if self.on_hang != "fail":
            self.event(events.WARNING, message=f"{message} (dist.on_hang is warn: the run goes on)")
            return
        with self._recording:  # one cause per rank: an exception raised first keeps its own (fail)
            if self.failing:
                return
            write_error(self.run, self.rank, error_record(
                self.rank, "Hung", message, stack_text(main_frame()), self.attempt, node_name(), self.step,
                where=found.where, waiting_ranks=waiting, reported_by="itself", **which))
            self.hang_reported = True

    def _waiting_peers(self) -> dict[int, dict[str, Any]]:
        """Peers whose status says they wait in a collective, with it (read only when this rank is stuck)."""
        found = {}
        for rank in range(self.world_size):
            status = self.run.read_status(rank) if rank != self.rank else None
            if status and status.get("state") == "running" and status.get("waiting") is True:
                found[rank] = status
        return found

    def dump_stacks(self) -> None:
        """Every thread's Python stack of this rank, into stacks/rank{R}.txt."""
        path = self.run.stacks(self.rank)
        with replacing(path, "w") as fh:  # a link in its place is replaced, not written through
            fh.write(f"# rank {self.rank} pid {os.getpid()} step {self.step} at {time.ctime()}\n")
            fh.flush()
            faulthandler.dump_traceback(fh, all_threads=True)

    def _tell_torchrun(self, peer: int) -> None:
        """Under torchrun: an error file dated after the peer's failure, so that torchrun names the
        peer as the root cause, not this rank that stopped because of it."""
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        failed_at = float((self.run.read_error(peer) or {}).get("time") or time.time())
        if path:
            write_json_atomic(Path(path), {"message": {
                "message": f"stopped because rank {peer} failed first (its traceback is above)",
                "extraInfo": {"py_callstack": "", "timestamp": str(int(failed_at) + 1)}}})

    def _abort(self, peers: list[int]) -> None:
        with self.saving, self._recording:  # never interrupt a checkpoint being written, nor an error
            if self.failing:
                return  # this rank raised too: it records its own error and ends by itself
            self.event(events.ABORTED, reason=f"rank {peers[0]} failed", failed_ranks=peers)
            self.set_state("aborted")
            self._tell_torchrun(peers[0])
            with contextlib.suppress(Exception):  # a crash never loses logged metrics
                self.write_held(False)
            self.metrics.close()
            self.events.close()
            os._exit(PEER_FAILED_EXIT_CODE)
