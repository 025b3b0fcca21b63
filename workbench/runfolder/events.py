"""The event kinds, and what a run's events say, folded once: the one reader of events for the Run
handle, the CLI, the dashboard and the end-of-run report.  Pure Python; records come from
``events/rank{R}.jsonl``, one object per line with "event" (its kind), rank, time, attempt.

The ranks write with these constants and the readers match on them: the strings are the run
folder's format and do not change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# --- what a rank's training says (engine.trainer, engine.rank, engine.checkpoint) ----------------
START = "start"
EPOCH_END = "epoch_end"
EVAL = "eval"
CHECKPOINT = "checkpoint"
CHECKPOINT_SKIPPED = "checkpoint_skipped"
RESUME = "resume"
RESCALE = "rescale"
EARLY_STOP = "early_stop"
PREEMPTED = "preempted"
END = "end"
# --- what the live checks find (engine.health, engine.mirrors, engine.script) --------------------
SYNC_CHECK = "sync_check"
SHARD_CHECK = "shard_check"
STRAGGLER = "straggler"
WARNING = "warning"
MEMORY = "memory"
# --- how a rank stopped (engine.monitor, engine.agent) -------------------------------------------
STALLED = "stalled"
HUNG = "hung"
ERROR = "error"
INTERRUPTED = "interrupted"
ABORTED = "aborted"
RESTART = "restart"

EVENT_KINDS: dict[str, str] = {
    START: "the rank started training (rank 0's: world size, device, effective batch, lr, steps) or a "
           "script or function started",
    EPOCH_END: "an epoch ended",
    EVAL: "validation results (val_* fields)",
    CHECKPOINT: "rank 0 wrote a checkpoint",
    CHECKPOINT_SKIPPED: "an unreadable checkpoint was passed over on resume",
    RESUME: "the attempt resumed from a checkpoint",
    RESCALE: "the run resumed at another world size: what changed",
    EARLY_STOP: "validation stopped improving: training stops",
    PREEMPTED: "a preemption or time-limit signal: checkpointed, waits to be requeued",
    END: "the rank ended its training (stop_reason, steps)",
    SYNC_CHECK: "parameters compared across ranks (in_sync, diverged ranks)",
    SHARD_CHECK: "the sampler's shards checked for overlap and coverage",
    STRAGGLER: "a rank's step time exceeded the ranks' median by dist.straggler_threshold",
    MEMORY: "the rank's peak memory over its first two steps (peak_mb; how: max_memory_allocated on CUDA, torch's "
            "MemTracker or FSDPMemTracker on CPU), which run.plan() checks the plan against",
    WARNING: "something the user should know (a mirror that failed, set_epoch not called)",
    STALLED: "no step for dist.stall_after_s: the rank's stacks were dumped",
    HUNG: "the rank was stuck outside a collective while others waited in one (where: its user frame)",
    ERROR: "the rank failed (its error file holds the traceback)",
    INTERRUPTED: "the rank was stopped by a signal (cancel)",
    ABORTED: "the rank stopped itself because another rank failed",
    RESTART: "a failed attempt was restarted (launch.max_restarts): which ranks failed and how",
}
"""Every kind of event a rank writes, with what it means."""


@dataclass
class EventSummary:
    start: dict[str, Any] | None = None
    """Rank 0's latest start event: world size, device, effective batch, lr, warmup, steps (a resume
    may change them)."""
    batches: list[tuple[int, int]] = field(default_factory=list)
    """(the step it started from, effective batch) of each of rank 0's start events in order: what the
    samples seen are counted from when a continue changed the batch."""
    shape_since: float | None = None
    """When the run took its current shape (world size, effective batch, strategy): the time of rank 0's
    start event that changed it on a continue (None: the shape it started with)."""
    in_sync: bool | None = None
    """Parameters matched on every rank at the latest check (None: not checked yet)."""
    diverged_ranks: list[int] = field(default_factory=list)
    first_diverged: str | None = None
    """The first parameter or buffer that differed at the latest check."""
    sync_checks_out_of_sync: int = 0
    straggler_warnings: int = 0
    """How often the ranks' own live check flagged a straggler (history; the current verdict is
    ``Run.stragglers()``)."""
    shards_ok: bool | None = None
    warnings: list[str] = field(default_factory=list)
    resumed_from: str | None = None
    """The checkpoint the latest attempt resumed from (rank 0's resume event)."""
    skipped_checkpoints: list[str] = field(default_factory=list)
    """Unreadable checkpoints passed over on resume, each "path: why"."""
    restarts: list[dict[str, Any]] = field(default_factory=list)
    """One restart event per failed attempt that was restarted (launch.max_restarts): which ranks
    failed and how."""
    memory: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Each rank's latest memory event (its newest attempt's first two steps: peak_mb, how)."""
    seen: int = 0
    """Records folded so far."""

    @property
    def total_steps(self) -> int | None:
        """The planned number of steps (None until the engine's rank 0 has started)."""
        total = (self.start or {}).get("total_steps")
        return int(total) if total is not None else None

    def fold(self, records: list[dict[str, Any]]) -> EventSummary:
        """Fold records that came after those already seen; returns self."""
        for record in records:
            _fold_one(self, record)
        self.seen += len(records)
        return self

    def health(self) -> dict[str, Any]:
        return {"in_sync": self.in_sync, "diverged_ranks": list(self.diverged_ranks),
                "first_diverged": self.first_diverged, "shards_ok": self.shards_ok,
                "warnings": list(self.warnings)}

    def check_counts(self) -> dict[str, int]:
        """What the engine's live checks found, for the report (kinds with a count of zero left out)."""
        found = {"straggler warnings": self.straggler_warnings,
                 "sync checks out of sync": self.sync_checks_out_of_sync}
        return {kind: n for kind, n in found.items() if n}


def _fold_one(summary: EventSummary, record: dict[str, Any]) -> None:
    kind = record.get("event")
    if kind == START and record.get("rank") == 0:
        if summary.start is not None and _shape(summary.start) != _shape(record):
            summary.shape_since = record.get("time")
        summary.start = record
        if isinstance(record.get("effective_batch"), int) and isinstance(record.get("step", 0), int):
            summary.batches.append((int(record.get("step", 0)), int(record["effective_batch"])))
    elif kind == SYNC_CHECK and "in_sync" in record:  # a damaged check (in_sync dropped) says nothing
        summary.in_sync = bool(record.get("in_sync"))
        summary.diverged_ranks = list(record.get("diverged_ranks") or [])
        summary.first_diverged = record.get("first_diverged")
        summary.sync_checks_out_of_sync += not summary.in_sync
    elif kind == STRAGGLER:
        summary.straggler_warnings += 1
    elif kind == SHARD_CHECK and "ok" in record:
        summary.shards_ok = bool(record["ok"])
    elif kind == RESUME and record.get("rank") == 0:
        summary.resumed_from = record.get("path")
    elif kind == CHECKPOINT_SKIPPED:
        summary.skipped_checkpoints.append(f"{record.get('path')}: {record.get('reason', '')}")
    elif kind == RESTART:
        summary.restarts.append(record)
    elif kind == MEMORY and isinstance(record.get("rank"), int):
        summary.memory[record["rank"]] = record
    elif kind == WARNING and "message" in record:
        summary.warnings.append(f"rank {record.get('rank')}: {record.get('message', '')}")


def _shape(start: dict[str, Any]) -> tuple[Any, ...]:
    return start.get("world_size"), start.get("effective_batch"), start.get("strategy")
