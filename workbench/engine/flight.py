"""Which collective a rank is in: PyTorch's flight recorder, read inside the rank by its heartbeat thread.

Every rank's agent sets TORCH_FR_BUFFER_SIZE (BUFFER_SIZE entries unless the user set it), so
each process group records the collectives issued on it, gloo's too: a sequence number per
group, the op, the tensor sizes, and `retired` once the collective's work completed.  The main
thread may be blocked in that collective; the heartbeat thread reads the record (a C++ call and
its JSON: 3.6 ms for BUFFER_SIZE entries at load 1 here, 8 ms at load 10), and only once the
rank has made no progress for the stall limit, so a healthy step never pays for a read.  Recording
costs about 4 us of CPU a collective (bench/flight_recorder_overhead.py).

A rank's latest collective is written into its status file (`collective`, `collective_seq`,
`collective_sizes`, `collective_done`); `engine.hang` compares the ranks' entries: the rank
that never entered collective #k, ranks in different collectives at the same number,
mismatched sizes."""

from __future__ import annotations

import json
import os
from typing import Any

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
BUFFER_SIZE = 64
"""Entries kept per rank: only the latest is read; a small ring keeps each record cheap."""
_WORLD = "default_pg"


def recorder_env() -> dict[str, str]:
    """The variable that turns the recorder on in a rank (a size the user set is kept; 0 turns it off)."""
    size = os.environ.get(BUFFER_ENV) or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or str(BUFFER_SIZE)
    return {BUFFER_ENV: size}


def _entries() -> list[dict[str, Any]]:
    try:
        from torch._C import _distributed_c10d

        trace = json.loads(_distributed_c10d._dump_fr_trace_json(True, False))  # type: ignore[attr-defined]
    except Exception:  # no distributed build, no recorder, no process group yet: nothing recorded
        return []
    return [e for e in trace.get("entries") or [] if isinstance(e, dict)]


def last_collective() -> dict[str, Any] | None:
    """The latest collective this rank issued on the world group, as its status file says it, or
    None (recorder off, or no collective yet): {"collective": "all_reduce", "collective_seq": 21,
    "collective_sizes": "[[10]]", "collective_done": False}."""
    world = [e for e in _entries() if not e.get("is_p2p") and _WORLD in (e.get("process_group") or ())]
    if not world:
        return None
    last = world[-1]
    same_group = [e for e in world if e.get("process_group") == last.get("process_group")]
    last = max(same_group, key=lambda e: int(e.get("collective_seq_id") or 0))
    return {"collective": op_name(str(last.get("profiling_name") or "")),
            "collective_seq": int(last.get("collective_seq_id") or 0),
            "collective_sizes": json.dumps(last.get("input_sizes") or []),
            "collective_done": bool(last.get("retired"))}


def op_name(profiling_name: str) -> str:
    """"gloo:all_reduce" -> "all_reduce"; "nccl:_reduce_scatter_base" -> "reduce_scatter_base"."""
    return profiling_name.rsplit(":", 1)[-1].lstrip("_") or "collective"
