"""The straggler rule, shared by the ranks' live check and the after-the-run report (no imports).

A rank's own work (data + compute) is compared with the median of the *other* ranks, so that with
2 ranks a 30% slower rank is flagged (the median of both would sit halfway between them)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def slower_than_others(work: Sequence[float], threshold: float) -> dict[int, tuple[float, float]]:
    """{index: (others' median, slower_by)} for entries above the others' median by > threshold."""
    found = {}
    for i, value in enumerate(work):
        others = [v for j, v in enumerate(work) if j != i]
        typical = statistics.median(others) if others else 0.0
        if typical > 0 and value > typical * (1 + threshold):
            found[i] = (typical, value / typical - 1)
    return found
