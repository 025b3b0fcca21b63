"""The step-then-rank table a cold read builds (workbench.runfolder.reader.merged_columns): the same
on two threads as on one, whatever the columns' dtypes and gaps."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.runfolder import reader

pytestmark = pytest.mark.timeout(60)


def _parts(ranks: int = 5, steps: int = 300) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    parts = []
    for rank in range(ranks):
        part = {"rank": np.full(steps, rank), "step": np.arange(1, steps + 1), "loss": rng.random(steps),
                "attempt": np.zeros(steps, dtype=np.int64), "note": np.array([f"r{rank}"] * steps, dtype=object)}
        if rank % 2:
            part["lr"] = rng.random(steps)  # only some ranks have it: missing (NaN) on the others
        parts.append(part)
    return parts


def test_the_interleave_on_two_threads_equals_the_one_thread_table(monkeypatch):
    parts = _parts()
    one = reader.merged_columns(parts)
    monkeypatch.setattr(reader, "PARALLEL_CELLS", 0)  # every table goes to the threads
    two = reader.merged_columns(parts)
    assert list(one) == list(two) == ["rank", "step", "loss", "attempt", "note", "lr"]
    for name in one:
        assert one[name].dtype == two[name].dtype
        assert np.array_equal(one[name], two[name], equal_nan=one[name].dtype.kind == "f"), name
    assert two["rank"][:5].tolist() == [0, 1, 2, 3, 4] and two["step"][:6].tolist() == [1, 1, 1, 1, 1, 2]
    assert np.isnan(two["lr"][0]) and two["lr"][1] == parts[1]["lr"][0]
