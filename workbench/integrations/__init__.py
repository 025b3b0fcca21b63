"""Per-rank streams for code written for other training frameworks: one line each.

    from workbench.integrations.lightning import WorkbenchLogger        # Trainer(logger=...), Fabric(loggers=...)
    from workbench.integrations.accelerate import WorkbenchTracker      # Accelerator(log_with=...)
    from workbench.integrations.transformers import WorkbenchCallback   # Trainer(callbacks=[...])

Each forwards what the framework logs, on every rank, to ``workbench.log`` (the rank's metrics file
in its run folder), so `run.metrics()`, `workbench show` and the dashboard show one line per rank.
They run inside the rank processes and do nothing when the job was not started by the workbench.
Nothing here is imported by ``import workbench``; each module imports its framework only."""

from __future__ import annotations

import math
from typing import Any


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The values that are plain numbers (tensors and numpy scalars turned into floats); text,
    arrays with more than one element and non-finite numbers left out, since a metric is one number."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if hasattr(value, "numel") and value.numel() != 1:
            continue
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[str(key)] = float(value)
    return out
