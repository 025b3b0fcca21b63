"""Full-fidelity decimation for drawing: the M4 aggregation (Jugel et al., "M4: A Visualization-Oriented
Time Series Data Aggregation", VLDB 2014), as W&B's line plots do by default.

The x range shown is cut into buckets no wider than a pixel column of the axes, and each bucket keeps
its first, last, lowest and highest point.  A line through those points covers the same pixels as
the line through every point (the paper's proof: within a column the line's vertical extent is set by
the min and max, and its joins to the neighbouring columns by the first and last), so a one-step
spike is drawn wherever it lies, and drawing costs what the pixels need (at most 4 points per
column), not what was logged.

The artists (``M4Line``, ``M4Band``) hold the full series and reduce it when they are drawn, for the
axes' x limits and width in pixels at that moment: a zoom or pan recomputes the buckets from the full
data, a bigger figure or a higher dpi gets finer buckets, and autoscaling sees the full data.
Smoothing, when asked, is applied to the full series before it reaches an artist (tensorboard#1518).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D

OVERSAMPLE = 2
"""Buckets per pixel column: a bucket narrower than a pixel keeps the guarantee, and 2 keeps it on a
HiDPI screen (ipympl draws at the device pixel ratio) and at the antialiasing's subpixel offsets."""


def m4_indices(x: np.ndarray, y: np.ndarray, x0: float, x1: float, buckets: int) -> np.ndarray:
    """Indices of the points to draw: per bucket of [x0, x1] the first, last, min and max point (the
    earliest of equal ones), plus the nearest point outside each end so the line reaches the edge.
    `x` must be sorted ascending and `x`, `y` finite.  All indices when there are few points."""
    n = len(x)
    lo = int(np.searchsorted(x, x0, "left"))
    hi = int(np.searchsorted(x, x1, "right"))
    first, last = max(lo - 1, 0), min(hi + 1, n)
    if hi - lo <= 4 * buckets or not x1 > x0:
        return np.arange(first, last)
    xs, ys = x[lo:hi], y[lo:hi]
    bucket = np.minimum(((xs - x0) * (buckets / (x1 - x0))).astype(np.int64), buckets - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    ends = np.r_[starts[1:], len(xs)] - 1
    segment = np.repeat(np.arange(len(starts)), ends - starts + 1)
    lows = _first_per_segment(ys == np.minimum.reduceat(ys, starts)[segment], segment)
    highs = _first_per_segment(ys == np.maximum.reduceat(ys, starts)[segment], segment)
    keep = np.unique(np.concatenate([starts, ends, lows, highs])) + lo
    return np.concatenate([np.arange(first, lo), keep, np.arange(hi, last)])


def _first_per_segment(mask: np.ndarray, segment: np.ndarray) -> np.ndarray:
    where = np.flatnonzero(mask)
    owner = segment[where]
    return where[np.r_[True, owner[1:] != owner[:-1]]]


def band_envelope(x: np.ndarray, low: np.ndarray, high: np.ndarray, x0: float, x1: float,
                  buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A min-max band reduced for drawing: per bucket the lowest `low` and highest `high` over the
    bucket's x span (from its first to its last point), so the reduced band covers every pixel the
    full band covers.  Few points: the band itself."""
    n = len(x)
    lo = max(int(np.searchsorted(x, x0, "left")) - 1, 0)
    hi = min(int(np.searchsorted(x, x1, "right")) + 1, n)
    if hi - lo <= 4 * buckets or not x1 > x0:
        return x[lo:hi], low[lo:hi], high[lo:hi]
    xs = x[lo:hi]
    bucket = np.clip(((xs - x0) * (buckets / (x1 - x0))).astype(np.int64), -1, buckets)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    ends = np.r_[starts[1:], len(xs)] - 1
    mins = np.minimum.reduceat(low[lo:hi], starts)
    maxs = np.maximum.reduceat(high[lo:hi], starts)
    bx = np.column_stack([xs[starts], xs[ends]]).ravel()  # each bucket's span, at its min and max
    return bx, np.repeat(mins, 2), np.repeat(maxs, 2)


def finite_sorted(x: np.ndarray, y: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, ...]:
    """The finite points of a series, in x order (a series is drawn through its finite points);
    `more` (e.g. the raw values beside a smoothed series) are taken along."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    rest = [np.asarray(m, dtype=float) for m in more]
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.all():
        x, y, rest = x[ok], y[ok], [m[ok] for m in rest]
    if len(x) > 1 and (np.diff(x) < 0).any():
        order = np.argsort(x, kind="stable")
        x, y, rest = x[order], y[order], [m[order] for m in rest]
    return (x, y, *rest)


def _bounds(x: np.ndarray, y: np.ndarray) -> tuple[float, ...] | None:
    """(x min, x max, y min, y max, smallest positive y) of finite data (x sorted), or None when empty."""
    if not len(x):
        return None
    low = float(y.min())
    if low > 0:
        positive = low
    else:
        above = y[y > 0]
        positive = float(above.min()) if len(above) else float("nan")
    return float(x[0]), float(x[-1]), low, float(y.max()), positive


def _columns(ax: Any) -> int:
    """Buckets for the axes' current width in device pixels."""
    return max(1, int(np.ceil(ax.bbox.width)) * OVERSAMPLE)


def _view(ax: Any) -> tuple[float, float, int]:
    x0, x1 = sorted(ax.get_xlim())
    return float(x0), float(x1), _columns(ax)


def last_bucket_start(x: np.ndarray, x0: float, x1: float, buckets: int) -> int:
    """Index of the first point of the bucket the last point falls in: what comes before it is final
    (a later point can change only the last bucket's min, max and last), and so is that point itself."""
    n = len(x)
    if not n:
        return 0
    if x[-1] > x1:  # the first point past the view is the last one drawn: final once it exists
        return min(int(np.searchsorted(x, x1, "right")), n - 1)
    if x[-1] < x0 or not x1 > x0:
        return n - 1
    scale = buckets / (x1 - x0)
    last = min(int((x[-1] - x0) * scale), buckets - 1)
    i = int(np.searchsorted(x, x0 + last / scale, "left"))
    while i > 0 and min(int((x[i - 1] - x0) * scale), buckets - 1) >= last:  # float rounding at the edge
        i -= 1
    while i < n - 1 and min(int((x[i] - x0) * scale), buckets - 1) < last:
        i += 1
    return i


class M4Line(Line2D):
    """A Line2D that holds the full series and draws its M4 reduction for the current view.

    While a series only grows (a live run), the reduction is extended, not recomputed: the buckets
    before the last one cannot change.  `final` counts the leading drawn points that later data
    cannot change, so a live view can keep them in its cached background and draw only the rest."""

    def __init__(self, x: np.ndarray, y: np.ndarray, raw: np.ndarray | None = None, **kwargs: Any):
        super().__init__([], [], **kwargs)
        self._kept: tuple[Any, ...] | None = None
        self.final = 0
        self.set_full(x, y, raw=raw)
        self.set_data(self.full_x, self.full_y)  # until drawn: the data limits (autoscale) see every point

    def set_full(self, x: np.ndarray, y: np.ndarray, stable: int | None = None, raw: np.ndarray | None = None) -> None:
        """Replace the full series (drawn through its finite points, in x order); `stable`: how many
        of its leading points cannot change any more (None: all of them, a series that only grows);
        `raw`: the unsmoothed values of a smoothed series (the hover shows both)."""
        n_given = len(x)
        self.full_raw: np.ndarray | None = None
        if raw is not None:
            self.full_x, self.full_y, self.full_raw = finite_sorted(x, y, raw)
        else:
            self.full_x, self.full_y = finite_sorted(x, y)
        self.stable = len(self.full_x) if stable is None or stable >= n_given else \
            int(np.isfinite(np.asarray(x[:stable], float) + np.asarray(y[:stable], float)).sum())
        self._reduced_for: tuple[Any, ...] | None = None  # reduced again at the next draw
        self.bounds = _bounds(self.full_x, self.full_y)

    def reduce(self) -> bool:
        """Set the drawn data to the M4 reduction for the axes' x limits and pixel width; returns
        whether the reduction was extended (the points drawn before are still drawn the same) rather
        than recomputed."""
        ax = self.axes
        if ax is None:
            return True
        view = _view(ax)
        n = len(self.full_x)
        if (view, n) == self._reduced_for:
            return True
        x, y = self.full_x, self.full_y
        kept = self._kept
        reuse = (kept is not None and kept[0] == view and kept[1] <= n and x[kept[1] - 1] == kept[2]
                 and y[kept[1] - 1] == kept[3])
        if reuse and kept is not None:  # only appended since: redo from the first point of the old last bucket
            start = kept[1] - 1
            idx = np.concatenate([kept[4][kept[4] < start], start + m4_indices(x[start:], y[start:], *view)])
        else:
            idx = m4_indices(x, y, *view)
        if n:
            boundary = min(last_bucket_start(x, *view), max(self.stable - 1, 0))
            self.final = int(np.searchsorted(idx, boundary, "right"))
            self._kept = (view, boundary + 1, x[boundary], y[boundary], idx)
        else:
            self.final, self._kept = 0, None
        self._set_quietly(x[idx], y[idx])
        self._reduced_for = (view, n)
        return reuse

    def part(self, start: int, stop: int | None = None) -> np.ndarray:
        """The reduced points [start, stop), joined to the point before start, as (n, 2) data
        coordinates (a live view draws a line's new part over its cached background)."""
        a = max(start - 1, 0)
        x, y = np.asarray(self.get_xdata(), float), np.asarray(self.get_ydata(), float)
        return np.column_stack([x[a:stop], y[a:stop]])

    def draw(self, renderer: Any) -> None:
        self.reduce()
        super().draw(renderer)

    def _set_quietly(self, x: np.ndarray, y: np.ndarray) -> None:
        """set_data without marking the figure stale (this runs inside a draw)."""
        callback, self.stale_callback = self.stale_callback, None
        try:
            self.set_data(x, y)
        finally:
            self.stale_callback = callback


class M4Band(PolyCollection):
    """A min-max band (fill between `low` and `high`) that draws its per-bucket envelope for the
    current view; its data limits are the full band's."""

    def __init__(self, x: np.ndarray, low: np.ndarray, high: np.ndarray, **kwargs: Any):
        super().__init__([], **kwargs)
        self.final = 0
        self.set_full(x, low, high)

    def set_full(self, x: np.ndarray, low: np.ndarray, high: np.ndarray, stable: int | None = None) -> None:
        x, low, high = (np.asarray(a, dtype=float) for a in (x, low, high))
        ok = np.isfinite(x) & np.isfinite(low) & np.isfinite(high)
        self.stable = int(ok[:stable].sum()) if stable is not None else int(ok.sum())
        x, low, high = finite_sorted(x[ok], low[ok], high[ok])
        self.full = (x, low, high)
        self._reduced_for: tuple[Any, ...] | None = None
        self._envelope = self.full
        self._set_quietly(*self.full)
        self.bounds = _bounds(self.full[0], np.r_[self.full[1], self.full[2]]) if len(self.full[0]) else None

    def get_datalim(self, transData: Any) -> Any:  # noqa: N803 - matplotlib's name
        from matplotlib.transforms import Bbox

        x, low, high = self.full
        if not len(x):
            return Bbox.null()
        box = Bbox([[x.min(), min(low.min(), high.min())], [x.max(), max(low.max(), high.max())]])
        return box.transformed(self.get_transform() - transData)

    def reduce(self) -> bool:
        ax = self.axes
        if ax is None:
            return True
        view = _view(ax)
        key = (view, len(self.full[0]))
        if key != self._reduced_for:
            x = self.full[0]
            self._envelope = band_envelope(*self.full, *view)
            boundary = min(last_bucket_start(x, *view), max(self.stable - 1, 0)) if len(x) else 0
            edge = x[boundary] if len(x) else np.inf
            self.final = int(np.searchsorted(self._envelope[0], edge, "left"))  # buckets that end before it
            self.final -= self.final % 2  # whole buckets (two vertices each)
            self._set_quietly(*self._envelope)
            self._reduced_for = key
        return True

    def part(self, start: int, stop: int | None = None) -> np.ndarray:
        """The envelope's vertices [start, stop) as one polygon (vertex start - 1 joins it to what
        is drawn), (n, 2) data coordinates."""
        x, low, high = self._envelope
        a = max(start - 1, 0)
        x, low, high = x[a:stop], low[a:stop], high[a:stop]
        return np.column_stack([np.r_[x, x[::-1]], np.r_[high, low[::-1]]])

    def draw(self, renderer: Any) -> None:
        self.reduce()
        super().draw(renderer)

    def _set_quietly(self, x: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        verts = [np.column_stack([np.r_[x, x[::-1]], np.r_[high, low[::-1]]])] if len(x) else []
        callback, self.stale_callback = self.stale_callback, None
        try:
            self.set_verts(verts)
        finally:
            self.stale_callback = callback
