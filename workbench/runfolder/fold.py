"""One rank's metric records as columns, and the rule that folds them into one row per step.

The rule, which `Run.metrics()`, the status and every view show:

- Records of one rank at one step **merge** into one row: the union of their fields, a field given
  twice keeping the value written last.  A script that logs ``loss`` and then ``lr`` at a step, the
  Hugging Face Trainer's summary at the last step, ``accelerator.log`` called twice per step: every
  value stays.
- An **attempt** (a restart or a requeue; the records' ``attempt`` field, 0 where absent) that logs a
  step an earlier attempt logged **replaces** it: per step, only the records of the highest attempt
  that logged it are merged; the earlier attempt's values of that step are dropped.

Rows are kept sorted by step, as numpy columns that grow in place, so a poll's few new records cost
what they cost; only rows at or after the first step a poll repeats are folded again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

_ABSENT = object()


@dataclass
class Batch:
    """Records of one rank in the order they were written, as columns: `values[name]` (int64,
    float64, bool or object), `present[name]` which rows hold the field (None: every row)."""

    values: dict[str, np.ndarray]
    present: dict[str, np.ndarray | None]

    def __len__(self) -> int:
        return len(self.values["step"])

    def attempts(self) -> np.ndarray:
        """Each row's attempt (0 where the record has none)."""
        values, mask = self.values.get("attempt"), self.present.get("attempt")
        if values is None:
            return np.zeros(len(self), dtype=np.int64)
        if mask is None and values.dtype.kind == "i":
            return values
        out = np.zeros(len(self), dtype=np.int64)
        rows = np.ones(len(self), bool) if mask is None else mask
        out[rows] = values[rows].astype(np.int64)
        return out


def from_records(records: list[dict[str, Any]]) -> Batch:
    """Cleaned records (workbench.runfolder.records.METRIC: every one has rank and step) as a Batch."""
    keys = records[0].keys()
    if all(record.keys() == keys for record in records):  # the usual block: every record has the same fields
        return Batch({name: _array([record[name] for record in records], None) for name in keys}, dict.fromkeys(keys))
    names = dict.fromkeys(key for record in records for key in record)
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray | None] = {}
    for name in names:
        cells = [record.get(name, _ABSENT) for record in records]
        mask = np.fromiter((cell is not _ABSENT for cell in cells), bool, len(cells))
        values[name] = _array([cell for cell in cells if cell is not _ABSENT], mask)
        present[name] = None if mask.all() else mask
    return Batch(values, present)


def _array(cells: list[Any], mask: np.ndarray | None) -> np.ndarray:
    """A column holding `cells` where `mask` is set (every row: None; missing elsewhere): int64,
    float64, bool or object."""
    types = set(map(type, cells))
    kind = "i" if types <= {int} else "f" if types <= {int, float} else "b" if types == {bool} else "O"
    dtype = _dtype({kind}, mask is not None and not mask.all())
    if mask is None and dtype.kind != "O":
        return np.array(cells, dtype=dtype)
    out = _missing(len(cells) if mask is None else len(mask), dtype)
    rows = slice(None) if mask is None else mask
    if out.dtype == object:
        held = np.empty(len(cells), dtype=object)
        held[:] = cells
        out[rows] = held
    else:
        out[rows] = cells
    return out


def _dtype(kinds: Iterable[str], missing: bool) -> np.dtype:
    """The one dtype that holds columns of these kinds (and, with `missing`, gaps)."""
    kinds = set(kinds)
    if kinds <= {"i"}:
        return np.dtype(np.float64 if missing else np.int64)
    if kinds <= {"i", "f"}:
        return np.dtype(np.float64)
    if kinds == {"b"} and not missing:
        return np.dtype(bool)
    return np.dtype(object)


def common_dtype(columns: list[np.ndarray | None]) -> np.dtype:
    """The dtype of these columns put end to end (None: a part without the column, so missing there)."""
    return _dtype({_kind(c) for c in columns if c is not None}, any(c is None for c in columns))


def _missing(n: int, dtype: np.dtype) -> np.ndarray:
    """n missing values: NaN in a float column, None in an object column."""
    if dtype.kind == "f":
        return np.full(n, np.nan, dtype=dtype)
    if dtype.kind == "O":
        return np.full(n, None, dtype=object)
    return np.zeros(n, dtype=dtype)


def _kind(values: np.ndarray) -> str:
    return values.dtype.kind if values.dtype.kind in "ifb" else "O"


def concat(parts: list[Batch]) -> Batch:
    """The rows of several batches, one after the other."""
    if len(parts) == 1:
        return parts[0]
    sizes = [len(part) for part in parts]
    names = dict.fromkeys(name for part in parts for name in part.values)
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray | None] = {}
    for name in names:
        masks = [part.present.get(name) if name in part.values else np.zeros(n, bool) for part, n in zip(parts, sizes)]
        whole = all(mask is None for mask in masks)
        dtype = _dtype({_kind(part.values[name]) for part in parts if name in part.values}, not whole)
        values[name] = np.concatenate([part.values[name].astype(dtype, copy=False) if name in part.values
                                       else _missing(n, dtype) for part, n in zip(parts, sizes)])
        present[name] = None if whole else np.concatenate(
            [np.ones(n, bool) if mask is None else mask for mask, n in zip(masks, sizes)])
    return Batch(values, present)


def fold(batch: Batch) -> Batch:
    """One row per step, sorted by step: per step the records of the highest attempt that logged
    it, merged in the order they were written (a field's last value wins)."""
    order = np.argsort(batch.values["step"], kind="stable")
    steps = batch.values["step"][order]
    first = np.r_[True, steps[1:] != steps[:-1]]
    group = np.cumsum(first) - 1
    attempts = batch.attempts()[order]
    best = np.maximum.reduceat(attempts, np.flatnonzero(first))
    kept = attempts == best[group]
    rows, group = order[kept], group[kept]
    groups = int(first.sum())
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray | None] = {}
    for name, column in batch.values.items():
        mask = batch.present[name]
        held = slice(None) if mask is None else mask[rows]
        at, into = rows[held], group[held]
        if not len(at):
            continue  # only in records that a later attempt replaced
        last = np.r_[into[1:] != into[:-1], True]
        at, into = at[last], into[last]
        if len(into) == groups:
            values[name], present[name] = column[at], None
            continue
        out = _missing(groups, _dtype({_kind(column)}, True))
        out[into] = column[at]
        seen = np.zeros(groups, bool)
        seen[into] = True
        values[name], present[name] = out, seen
    return Batch(values, present)


class RankRows:
    """One rank's rows: one per step, sorted by step, the fold of every record read so far.

    Columns grow in place (capacity 1.5x when full); a batch whose steps all come after the last
    row is appended as it is, one that repeats or goes back to a step folds the rows from that step
    on again."""

    def __init__(self) -> None:
        self.n = 0
        self.values: dict[str, np.ndarray] = {}
        self.present: dict[str, np.ndarray | None] = {}
        self.capacity = 0
        self._borrowed = False  # the columns are a batch's own arrays (maybe read-only): copy before writing

    def column(self, name: str) -> np.ndarray | None:
        """A view of one column (None if no row has it)."""
        values = self.values.get(name)
        return None if values is None else values[:self.n]

    def columns(self) -> dict[str, np.ndarray]:
        return {name: values[:self.n] for name, values in self.values.items()}

    def add(self, batch: Batch) -> None:
        steps = batch.values["step"]
        if not len(steps):
            return
        ordered = len(steps) < 2 or bool((steps[1:] > steps[:-1]).all())
        if self.n and int(steps.min()) <= int(self.values["step"][self.n - 1]) or not ordered:
            start = int(np.searchsorted(self.values["step"][:self.n], steps.min())) if self.n else 0
            batch = fold(concat([self._rows(start), batch]) if start < self.n else batch)
            self._truncate(start)
        self._append(batch)

    def _rows(self, start: int) -> Batch:
        return Batch({name: values[start:self.n] for name, values in self.values.items()},
                     {name: None if mask is None else mask[start:self.n] for name, mask in self.present.items()})

    def _truncate(self, n: int) -> None:
        """Keep the first n rows; a column none of them holds goes."""
        self.n = n
        for name in list(self.values):
            mask = self.present[name]
            if not n or (mask is not None and not mask[:n].any()):
                del self.values[name], self.present[name]

    def _append(self, batch: Batch) -> None:
        m, end = len(batch), self.n + len(batch)
        if not self.n:  # the first rows (a cold read): the batch's own arrays, no copy
            self.values, self.present = dict(batch.values), dict(batch.present)
            self.n = self.capacity = m
            self._borrowed = True
            return
        if end > self.capacity or self._borrowed:
            self.capacity = max(end, int(self.capacity * 1.5) + 1024)
            self._borrowed = False
            self.values = {name: _resized(values, self.n, self.capacity) for name, values in self.values.items()}
            self.present = {name: None if mask is None else _resized(mask, self.n, self.capacity)
                            for name, mask in self.present.items()}
        for name in dict.fromkeys([*self.values, *batch.values]):
            self._append_column(name, batch, m)
        self.n = end

    def _append_column(self, name: str, batch: Batch, m: int) -> None:
        old, new = self.values.get(name), batch.values.get(name)
        old_mask = self.present.get(name) if old is not None else np.zeros(self.capacity, bool)
        new_mask = batch.present.get(name) if new is not None else np.zeros(m, bool)
        whole = old_mask is None and new_mask is None
        kinds = {_kind(v) for v in (old, new) if v is not None}
        dtype = _dtype(kinds, not whole)
        if old is None:
            old = _missing(self.capacity, dtype)
        elif old.dtype != dtype:
            old = _retyped(old, self.n, dtype, old_mask)
        old[self.n:self.n + m] = new.astype(dtype, copy=False) if new is not None else _missing(m, dtype)
        self.values[name] = old
        if whole:
            self.present[name] = None
            return
        if old_mask is None:
            old_mask = np.ones(self.capacity, bool)
        old_mask[self.n:self.n + m] = True if new_mask is None else new_mask
        self.present[name] = old_mask


def _resized(values: np.ndarray, n: int, capacity: int) -> np.ndarray:
    out = np.empty(capacity, dtype=values.dtype)
    out[:n] = values[:n]
    return out


def _retyped(values: np.ndarray, n: int, dtype: np.dtype, mask: np.ndarray | None) -> np.ndarray:
    """A column as another dtype (int -> float, bool -> object, ...), missing rows as missing."""
    out = _missing(len(values), dtype)
    out[:n] = values[:n].astype(dtype)
    if mask is not None:
        out[:n][~mask[:n]] = _missing(1, dtype)[0]
    return out
