"""PNG frames of the run figure for a live view, cheap enough to redraw every poll.

The figure is drawn by ``workbench.plots.plot_run`` (once, and again whenever the set of ranks or
panels changes).  Later frames reuse its Figure and Axes: line data is updated in place, and while
every line still fits the axis limits only the lines are drawn, over a cached background (axes,
ticks, titles, legend), each line reduced to the min and max of every pixel column it covers
(it looks the same; Agg's cost grows with vertices).  Limits get headroom (x up to the run's total
steps), so the full redraw with text layout - most of matplotlib's cost - happens only now and then.
Agg canvas, no pyplot.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.plots import PANELS, plot_run

if TYPE_CHECKING:
    import pandas as pd

Series = dict[str, tuple[np.ndarray, np.ndarray]]
Limits = tuple[tuple[float, float], tuple[float, float]]


def line_series(parts: dict[Any, pd.DataFrame], column: str) -> Series:
    """The lines plot_run draws for `column`, by label: "rank R" per rank, plus "reduced" for loss."""
    if not parts or any(column not in p for p in parts.values()):
        return {}
    out = {f"rank {r}": (p["step"].to_numpy(float), p[column].to_numpy(float)) for r, p in parts.items()}
    if column == "loss" and "loss_reduced" in next(iter(parts.values())):
        first = parts[min(parts)]
        out["reduced"] = (first["step"].to_numpy(float), first["loss_reduced"].to_numpy(float))
    return out


class LivePlot:
    """Renders metric frames to PNG bytes, redrawing only what changed."""

    def __init__(self, panels: Sequence[str] = PANELS, max_points: int = 2000, dpi: int = 72,
                 figsize: tuple[float, float] | None = None):
        self.panels, self.max_points = tuple(panels), max_points
        self.figsize, self.dpi = figsize or (4.2 * len(self.panels), 3.2), dpi
        self.fig: Any = None  # made on the first render: importing matplotlib takes a while
        self.canvas: Any = None
        self._key: Any = None
        self._lines: list[dict[str, Any]] = []
        self._static = False
        self._background: Any = None
        self.full_draws = 0
        self.line_draws = 0

    def render(self, frame: pd.DataFrame, total_steps: int | None = None) -> bytes:
        if self.fig is None:
            self._make_figure()
        parts = dict(tuple(frame.groupby("rank"))) if len(frame) and "rank" in frame else {}
        series = [line_series(parts, column) for column in self.panels]
        key = tuple(tuple(s) for s in series)
        if key != self._key:
            self._rebuild(frame, key, series)
        if self._static:
            plot_run(frame, self.panels, self.max_points, fig=self.fig)
            self.canvas.draw()
            return self.png()
        stale = [_limits(s, ax.get_xlim(), ax.get_ylim(), total_steps) for s, ax in zip(series, self.fig.axes)]
        if self._background is None or any(lim is not None for lim in stale):
            self._full_draw(series, total_steps)
        else:
            self.canvas.restore_region(self._background)
            self.line_draws += 1
        self._draw_lines(series)
        return self.png()

    def _make_figure(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.fig = Figure(figsize=self.figsize, dpi=self.dpi, layout="constrained")
        self.canvas = FigureCanvasAgg(self.fig)

    def _rebuild(self, frame: pd.DataFrame, key: Any, series: list[Series]) -> None:
        plot_run(frame, self.panels, self.max_points, fig=self.fig)
        self._lines = [{line.get_label(): line for line in ax.get_lines()} for ax in self.fig.axes]
        # Lines not where line_series expects them (plot_run changed): redraw everything each time.
        self._static = [set(lines) for lines in self._lines] != [set(s) for s in series]
        for lines in self._lines:
            for line in lines.values():
                line.set_animated(not self._static)  # drawn over the cached background, not with it
        self._key, self._background = key, None

    def _full_draw(self, series: list[Series], total_steps: int | None) -> None:
        for ax, lines_data in zip(self.fig.axes, series):
            if lines_data:
                xlim, ylim = _wanted(lines_data, total_steps)
                ax.set_xlim(xlim)
                ax.set_ylim(ylim)
        self.canvas.draw()  # animated lines are left out: this is the background
        self._background = self.canvas.copy_from_bbox(self.fig.bbox)
        self.full_draws += 1

    def _draw_lines(self, series: list[Series]) -> None:
        for ax, lines, lines_data in zip(self.fig.axes, self._lines, series):
            for label, (x, y) in lines_data.items():
                lines[label].set_data(*envelope(x, y, _pixel_columns(ax, x)))
                ax.draw_artist(lines[label])

    def png(self) -> bytes:
        from PIL import Image

        image = Image.fromarray(np.asarray(self.canvas.buffer_rgba())).convert("RGB")
        out = io.BytesIO()
        image.save(out, format="png", compress_level=1)
        return out.getvalue()


def envelope(x: np.ndarray, y: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ~2 points per pixel column: each column's min and max, in order (looks the same)."""
    n = len(y)
    if columns < 1 or n <= 4 * columns:
        return x, y
    k = -(-n // columns)
    m = (n // k) * k
    chunks = y[:m].reshape(-1, k)
    lows = np.argmin(np.where(np.isnan(chunks), np.inf, chunks), axis=1)
    highs = np.argmax(np.where(np.isnan(chunks), -np.inf, chunks), axis=1)
    starts = np.arange(len(chunks)) * k
    keep = np.unique(np.concatenate([[0], starts + lows, starts + highs, np.arange(m, n), [n - 1]]))
    return x[keep], y[keep]


def _pixel_columns(ax: Any, x: np.ndarray) -> int:
    """How many pixel columns the data's x range covers in `ax`."""
    lo, hi = ax.get_xlim()
    if not len(x) or hi <= lo:
        return 0
    return int(math.ceil(ax.bbox.width * (float(np.nanmax(x)) - float(np.nanmin(x))) / (hi - lo)))


def _span(values: list[np.ndarray]) -> tuple[float, float] | None:
    finite = [v[np.isfinite(v)] for v in values]
    finite = [v for v in finite if v.size]
    if not finite:
        return None
    return float(min(v.min() for v in finite)), float(max(v.max() for v in finite))


def _wanted(series: Series, total_steps: int | None) -> Limits:
    """Axis limits with headroom: x to the total steps (or 25% past the data), y padded 8%."""
    xs = _span([x for x, _ in series.values()]) or (0.0, 1.0)
    ys = _span([y for _, y in series.values()]) or (0.0, 1.0)
    x_hi = float(total_steps) if total_steps and total_steps >= xs[1] else xs[0] + 1.25 * (xs[1] - xs[0])
    x_hi = max(x_hi, xs[0] + 1.0)
    pad = (ys[1] - ys[0]) * 0.08 or max(abs(ys[1]) * 0.05, 1e-6)
    return (xs[0], x_hi), (ys[0] - pad, ys[1] + pad)


def _limits(series: Series, xlim: tuple[float, float], ylim: tuple[float, float],
            total_steps: int | None) -> Limits | None:
    """None while the current limits still suit the data, else the limits it wants."""
    if not series:
        return None
    xs = _span([x for x, _ in series.values()])
    ys = _span([y for _, y in series.values()])
    if xs is None or ys is None:
        return None
    want_x, want_y = _wanted(series, total_steps)
    x_ok = xlim[0] <= xs[0] and xs[1] <= xlim[1] and (xlim[1] - xlim[0]) <= 2 * (want_x[1] - want_x[0])
    y_ok = ylim[0] <= ys[0] and ys[1] <= ylim[1] and (ylim[1] - ylim[0]) <= 1.6 * (want_y[1] - want_y[0])
    return None if x_ok and y_ok else (want_x, want_y)
