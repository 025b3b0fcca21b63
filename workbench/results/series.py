"""A run's metrics as the plots read them: per rank, numpy columns in step order (``MetricData``), and
the views drawn from them, kept up to date cheaply while a run grows.

Everything is computed on the full series, never on a subsample: a smoothed curve (``Smoother``,
TensorBoard's debiased EMA) does not depend on how many points are drawn (tensorboard#1518), and the
median/min/max across ranks (``BandCache``) sees every step of every rank.  A refresh pays only for
the records that arrived since the last one: both keep the part of their result that cannot change
any more (what every rank has logged past) and recompute the rest.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from workbench.launch.run import Run

Columns = dict[str, np.ndarray]
BOOKKEEPING = frozenset({"rank", "step", "time", "epoch", "attempt", "wall_time", "elapsed_s", "samples",
                         "micro_in_epoch"})
"""Columns every record carries that are not metrics to plot."""


def samples_seen(steps: np.ndarray, batches: Sequence[tuple[int, int]]) -> np.ndarray:
    """The samples all ranks saw by each of `steps`: `batches` are (the step it started from, effective
    batch) in the order the run took them, each stretch counted at its own batch (a continue at another
    world size or micro-batch starts a new one from its checkpoint's step)."""
    steps = np.asarray(steps, dtype=float)
    starts = [float(start) for start, _ in batches]
    seen = [0.0]  # samples at each stretch's start
    for i in range(1, len(batches)):
        seen.append(seen[-1] + (starts[i] - starts[i - 1]) * batches[i - 1][1])
    which = np.clip(np.searchsorted(starts, steps, side="left") - 1, 0, len(batches) - 1)
    return (np.asarray(seen)[which] + (steps - np.asarray(starts)[which]) * np.asarray([b for _, b in batches])[which])


@dataclass
class MetricData:
    """rank -> {column: values}, each rank's rows in step order (numpy views: no copy), plus what the
    derived x axes need and the run's eval events."""

    ranks: dict[int, Columns]
    evals: pd.DataFrame | None = None
    samples_per_step: int | None = None
    """samples = step x this (None: a `samples` column if the rows have one)."""
    origin: float | None = None
    """elapsed_s = time - this (None: an `elapsed_s` column if the rows have one, else the first time)."""
    version: int = 0
    names: list[str] = field(default_factory=list)
    """Every column some rank has, in the order first seen."""
    batches: tuple[tuple[int, int], ...] = ()
    """Where a continue changed the effective batch, its stretches (samples_seen), used before samples_per_step."""

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, evals: pd.DataFrame | None = None) -> MetricData:
        """From a metrics DataFrame (Run.metrics(): one row per rank and step)."""
        if not len(frame) or "rank" not in frame or "step" not in frame:
            return cls({}, evals)
        frame = frame.sort_values(["rank", "step"], kind="stable")
        rank_of = frame["rank"].to_numpy()
        bounds = np.flatnonzero(np.r_[True, rank_of[1:] != rank_of[:-1], True])
        names = [str(c) for c in frame.columns if frame[c].dtype.kind in "biuf"]
        arrays = {c: frame[c].to_numpy() for c in names}
        ranks = {int(rank_of[a]): {c: v[a:b] for c, v in arrays.items()} for a, b in zip(bounds[:-1], bounds[1:])}
        return cls(ranks, evals, names=names)

    @classmethod
    def from_run(cls, run: Run, evals: pd.DataFrame | None = None) -> MetricData:
        """What the run's one reader holds now (no poll: the caller polled once for this snapshot)."""
        frames = run.metric_frames
        ranks = list(frames.frames)
        names: list[str] = []
        for rank in ranks[:1] + ranks[-1:]:  # ranks log the same fields; the first and last say which
            names += [str(c) for c in list(frames.frames.rows[rank].values) if str(c) not in names]  # no DataFrame
        version, found = frames.versioned(names)  # one read: the version is that of these columns
        numeric = {r: {c: v for c, v in cols.items() if getattr(getattr(v, "dtype", None), "kind", "O") in "biuf"}
                   for r, cols in found.items()}
        return cls(numeric, evals, run.samples_per_step(), run.meta.get("created"), version,
                   [n for n in names if any(n in cols for cols in numeric.values())], run.sample_batches())

    def columns(self) -> list[str]:
        return self.names or sorted({c for cols in self.ranks.values() for c in cols})

    def has(self, column: str) -> bool:
        return any(column in cols and np.isfinite(np.asarray(cols[column], float)).any()
                   for cols in self.ranks.values())

    def x(self, rank: int, axis: str, start: int = 0) -> np.ndarray:
        """The rank's x values on `axis` ("step", "samples" or "elapsed_s"; step when it cannot be
        had), from row `start` on."""
        cols = self.ranks[rank]
        steps = np.asarray(cols["step"][start:], dtype=float)
        if axis == "samples":
            if self.batches:
                return samples_seen(steps, self.batches)
            if self.samples_per_step:
                return steps * float(self.samples_per_step)
            return np.asarray(cols["samples"][start:], float) if "samples" in cols else steps
        if axis == "elapsed_s":
            if "time" in cols and (self.origin is not None or "elapsed_s" not in cols):
                return np.asarray(cols["time"][start:], float) - self.origin_time()
            return np.asarray(cols["elapsed_s"][start:], float) if "elapsed_s" in cols else steps
        return steps

    def origin_time(self) -> float:
        if self.origin is not None:
            return float(self.origin)
        times = [float(np.nanmin(c["time"])) for c in self.ranks.values() if "time" in c and len(c["time"])]
        self.origin = min(times) if times else 0.0
        return self.origin

    def axis(self, wanted: str) -> str:
        """`wanted` if the data can give it, else "step"."""
        if wanted == "samples" and not self.samples_per_step and not any("samples" in c for c in self.ranks.values()):
            return "step"
        if wanted == "elapsed_s" and not any("time" in c or "elapsed_s" in c for c in self.ranks.values()):
            return "step"
        return wanted

    def last_steps(self) -> dict[int, int]:
        """rank -> the last step in this snapshot."""
        return {r: int(c["step"][-1]) for r, c in self.ranks.items() if "step" in c and len(c["step"])}

    def extent(self, axis: str) -> tuple[float, float] | None:
        """The lowest and highest x of every rank's rows and the evals on `axis` (None: no data)."""
        lows, highs = [], []
        for rank in self.ranks:
            xs = self.x(rank, axis)
            if len(xs):
                lows.append(float(np.nanmin(xs)))
                highs.append(float(np.nanmax(xs)))
        if not lows:
            return None
        return min(lows), max(highs)


# --- smoothing -------------------------------------------------------------------------------------
# One rule: the weight applies per logged point, as TensorBoard applies it (its debiased EMA:
# s_i = sum_j<=i w^(i-j) v_j / sum_j<=i w^(i-j), NaNs skipped), on the full series before any
# reduction for drawing.  The smoothed value at a step depends only on the values up to it: it does
# not change as the run grows or with the number of points drawn (tensorboard#1518), and it is the
# value TensorBoard shows for the same points at the same weight.  A long noisy series wants a heavier
# weight (0.9-0.99) for the same look as a short one; the slider gives it.


def ema_from(values: np.ndarray, weight: float, num: float = 0.0, den: float = 0.0
             ) -> tuple[np.ndarray, float, float]:
    """TensorBoard's debiased EMA continued from a state (num, den: the weighted sum and the sum of
    weights so far; 0, 0 to start).  NaNs are skipped (their output repeats the last value).  Returns
    the smoothed values and the state after them."""
    import pandas as pd

    values = np.asarray(values, dtype=float)
    if not len(values):
        return values, num, den
    if len(values) <= 64:  # a refresh's few new points: a loop costs less than pandas' set-up
        out = np.empty(len(values))
        for i, value in enumerate(values.tolist()):
            if value == value:
                num, den = weight * num + value, weight * den + 1.0
            out[i] = num / den if den > 0 else np.nan
        return out, num, den
    own = pd.Series(values).ewm(alpha=1 - weight, adjust=True, ignore_na=True).mean().to_numpy()
    seen = np.cumsum(np.isfinite(values))
    decay = weight ** seen
    own_den = (1 - decay) / (1 - weight)
    own_num = np.where(seen > 0, own * own_den, 0.0)
    total_num, total_den = decay * num + own_num, decay * den + own_den
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total_den > 0, total_num / np.where(total_den > 0, total_den, 1.0), np.nan)
    return out, float(total_num[-1]), float(total_den[-1])


class Smoother:
    """EMAs of growing series, each kept by a key: a call smooths only what follows the part of the
    series given as stable at the last call (the whole series, unless said otherwise)."""

    def __init__(self) -> None:
        self._kept: dict[Any, tuple[float, int, float, float, float, np.ndarray]] = {}

    def __call__(self, key: Any, values: np.ndarray, weight: float, stable: int | None = None) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        if weight <= 0 or not len(values):
            return values
        n = len(values)
        start, num, den, prefix = 0, 0.0, 0.0, values[:0]
        kept = self._kept.get(key)
        if kept is not None:
            k_weight, k_n, k_last, k_num, k_den, k_out = kept
            same = k_weight == weight and 0 < k_n <= n and _same(values[k_n - 1], k_last)
            if same:
                start, num, den, prefix = k_n, k_num, k_den, k_out
        tail, _, _ = ema_from(values[start:], weight, num, den)
        out = np.concatenate([prefix, tail]) if start else tail
        stable = n if stable is None else max(0, min(stable, n))
        if stable > 0:
            s_num, s_den = _state_at(values, out, weight, stable)
            self._kept[key] = (weight, stable, values[stable - 1], s_num, s_den, out[:stable].copy())
        return out

    def forget(self) -> None:
        self._kept.clear()


def _same(a: float, b: float) -> bool:
    return bool(a == b or (a != a and b != b))


def _state_at(values: np.ndarray, out: np.ndarray, weight: float, n: int) -> tuple[float, float]:
    """The EMA's (num, den) after values[:n], from its output (den has a closed form)."""
    seen = int(np.isfinite(values[:n]).sum())
    den = (1 - weight ** seen) / (1 - weight)
    return (float(out[n - 1]) * den if seen else 0.0), den


# --- many ranks as one picture ---------------------------------------------------------------------
OUTLIER_MAD = 4.0
"""A rank is an outlier when its mean distance from the median exceeds this many median distances."""


@dataclass
class Band:
    """Many ranks as one picture: per step (x), the median across ranks, the mean, min and max of the
    ranks that agree, and the ranks that stray (drawn on their own)."""

    x: np.ndarray
    median: np.ndarray
    low: np.ndarray
    high: np.ndarray
    outliers: list[int]
    mean: np.ndarray = field(default_factory=lambda: np.array([]))
    stable: int = 0
    """Leading rows that later records cannot change (every rank has logged past them)."""


@dataclass
class _Rows:
    steps: np.ndarray
    x: np.ndarray
    median: np.ndarray
    mean: np.ndarray
    table: np.ndarray
    """rows x ranks values (NaN where a rank logged nothing at that step)."""


class BandCache:
    """Median, mean, min-max band and outliers across ranks per step, per column; a call recomputes
    only the rows after those every rank had logged past at the last call."""

    def __init__(self) -> None:
        self._kept: dict[Any, dict[str, Any]] = {}

    def __call__(self, data: MetricData, column: str, axis: str = "step") -> Band:
        ranks = sorted(r for r, c in data.ranks.items() if column in c and len(c[column]))
        if not ranks:
            return Band(*(np.array([]),) * 4, [], np.array([]))
        series = {r: (data.ranks[r]["step"], data.ranks[r][column]) for r in ranks}  # as read: no copies
        kept = self._kept.pop((column, axis), None)
        if kept is not None and not _still_valid(kept, ranks, series):
            kept = None
        rows = _rows_after(data, series, ranks, axis, kept["done"] if kept is not None else -np.inf)
        sums, counts = _distance_sums(rows)
        head = kept or {"done": -np.inf, "x": [], "median": [], "mean": [], "low": [], "high": [], "sums": 0.0,
                        "counts": 0, "stray": None}
        stray = {ranks[i] for i in _strays(sums + head["sums"], counts + head["counts"],
                                           np.r_[head["median"], rows.median])}
        if kept is not None and stray != kept["stray"]:  # the band's members changed: every row again
            return self(data, column, axis)
        inliers = [i for i, r in enumerate(ranks) if r not in stray] or list(range(len(ranks)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows of the inliers
            low, high = np.nanmin(rows.table[:, inliers], axis=1), np.nanmax(rows.table[:, inliers], axis=1)
        out = {"x": rows.x, "median": rows.median, "mean": rows.mean, "low": low, "high": high}
        full = {k: np.r_[head[k], v] for k, v in out.items()}
        complete = min(s[-1] for s, _ in series.values())  # every rank has logged up to here
        k = int(np.searchsorted(rows.steps, complete, "right"))
        done_sums, done_counts = _distance_sums(_Rows(rows.steps[:k], rows.x[:k], rows.median[:k],
                                                      rows.mean[:k], rows.table[:k]))
        n_done = len(head["x"]) + k
        self._kept[(column, axis)] = {
            **{name: values[:n_done] for name, values in full.items()}, "ranks": ranks, "stray": stray,
            "done": float(rows.steps[k - 1]) if k else head["done"], "sums": head["sums"] + done_sums,
            "counts": head["counts"] + done_counts,
            "last": {r: (len(s), s[-1], float(v[-1])) for r, (s, v) in series.items()}}
        return Band(full["x"], full["median"], full["low"], full["high"], [r for r in ranks if r in stray],
                    full["mean"], n_done)


def _still_valid(kept: dict[str, Any], ranks: list[int], series: dict[int, Any]) -> bool:
    """The same ranks, each having only appended since (a requeue that replaced steps: recompute)."""
    if kept["ranks"] != ranks:
        return False
    for rank, (n, step, value) in kept["last"].items():
        steps, values = series[rank]
        if len(steps) < n or steps[n - 1] != step or not _same(float(values[n - 1]), value):
            return False
    return True


def _rows_after(data: MetricData, series: dict[int, tuple[np.ndarray, np.ndarray]], ranks: list[int], axis: str,
                done: float) -> _Rows:
    """The rows (one per step logged by any rank) after step `done`, ranks as columns (only those
    rows are read and converted: a refresh pays for what is new)."""
    tails = {}
    for r, (s, v) in series.items():
        i = int(np.searchsorted(s, done, "right"))
        tails[r] = (np.asarray(s[i:], float), np.asarray(v[i:], float), data.x(r, axis, i))
    first = tails[ranks[0]][0]
    if all(len(tails[r][0]) == len(first) and np.array_equal(tails[r][0], first) for r in ranks):
        steps = first  # the usual run: every rank logged the same steps (no sort, no scatter)
        table = np.column_stack([tails[r][1] for r in ranks]) if len(first) else np.empty((0, len(ranks)))
        xs = np.column_stack([tails[r][2] for r in ranks]) if len(first) else np.empty((0, len(ranks)))
    else:
        steps = np.unique(np.concatenate([t[0] for t in tails.values()]))
        table = np.full((len(steps), len(ranks)), np.nan)
        xs = np.full((len(steps), len(ranks)), np.nan)
        for j, rank in enumerate(ranks):
            s, v, x = tails[rank]
            at = np.searchsorted(steps, s)
            table[at, j], xs[at, j] = v, x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows no rank has a value in
        full = not np.isnan(table).any()  # the usual case: np.median, not the slow masked nanmedian
        median = np.median(table, axis=1) if full else np.nanmedian(table, axis=1)
        mean = table.mean(axis=1) if full else np.nanmean(table, axis=1)
        x = xs[:, 0] if not np.isnan(xs[:, 0]).any() else np.nanmin(xs, axis=1)
    return _Rows(steps, x, median, mean, table)


def _distance_sums(rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: the sum of its distances from the median, and how many rows it has."""
    distance = np.abs(rows.table - rows.median[:, None])
    present = np.isfinite(distance)
    return np.where(present, distance, 0.0).sum(axis=0), present.sum(axis=0)


def _strays(sums: np.ndarray, counts: np.ndarray, median: np.ndarray) -> set[int]:
    """Column indices (into the ranks) whose mean distance from the median is over OUTLIER_MAD
    typical distances; when the ranks agree exactly, any rank that differs at all."""
    with np.errstate(invalid="ignore", divide="ignore"):
        distance = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    finite = distance[np.isfinite(distance)]
    typical = float(np.median(finite)) if len(finite) else 0.0
    scale = float(np.nanmean(np.abs(median))) if len(median) and np.isfinite(median).any() else 0.0
    limit = OUTLIER_MAD * typical if typical > 0 else 1e-9 * (scale + 1e-12)
    return {int(i) for i in np.flatnonzero(np.isfinite(distance) & (distance > limit))}
