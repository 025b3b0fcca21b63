"""What a run's figure shows, as data: which panels (only those with data, named after the metrics the
job logged) and, per panel, the series to draw (``Spec``: full x and y, style, label).

Pure numpy over ``MetricData``; ``workbench.results.plots`` turns specs into matplotlib artists (the
static figure) and ``workbench.ui.render`` keeps them up to date (the live one).  Smoothing and the
median band are computed on the full series here, before any reduction for drawing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.results.metricview import BAND_ABOVE_RANKS
from workbench.results.series import BOOKKEEPING, Band, BandCache, MetricData, Smoother

LOSS_NAMES = ("loss", "train_loss", "train/loss", "training_loss", "loss_step", "train_loss_step")
"""The training loss, by the names jobs log it under (the first one found is drawn)."""
EVAL_PREFIXES = ("val_", "val/", "eval_", "eval/", "test_", "valid_", "validation_")
KNOWN = {"lr": "learning rate (lr)", "step_time_s": "step time (s)", "samples_per_s": "samples/s per rank",
         "mem_mb": "peak memory (MiB)"}
SMOOTHED = ("step_time_s", "samples_per_s")
"""Panels besides the loss whose series are smoothed (noisy per step); their raw values are drawn as
a faint band reaching from the smoothed line to each one (ENVELOPE_ALPHA), not as a line."""
FROM_ZERO = ("mem_mb",)
"""Panels whose y axis starts at 0 (Panel.from_zero)."""
HIDDEN = BOOKKEEPING | {"loss_reduced", "data_time_s", "compute_s", "comm_wait_s", "comm_busy_s", "grad_norm_sync"}
MAX_PANELS = 9
RAW_ALPHA = 0.25
ENVELOPE_ALPHA = 0.3
"""The raw band of a SMOOTHED panel.  Per-rank step time and throughput are noise around a level: over
20,000 steps a raw line zig-zags through every pixel column's min and max (M4 keeps them) and each
rank's strokes, antialiased over one another, filled the panel as a solid block with the smoothed
lines lost in it.  Drawn instead as W&B draws a bucketed series (the line over its min-max area) and
TensorBoard a smoothed one (the raw faint behind it): one faint fill per rank with a thin outline,
every raw value inside it (a one-step spike is drawn: a stroke to its height), the smoothed line on top."""


LEVEL_POINTS = 500
"""A SMOOTHED panel's EMA averages over at least 1/LEVEL_POINTS of the series (level_window): a weight
per logged point (TensorBoard's 0.6: 2.5 points) leaves a 20,000-step series as noisy as the raw one
at a panel's ~300-1000 pixel columns, where W&B draws a bucket's mean.  There, step time and
throughput are read as a level per rank (and a spike as a spike, in the raw band behind it)."""


def level_window(points: int) -> int:
    """The fewest steps a SMOOTHED panel's EMA averages over for a series of `points`: 1 (the slider's
    weight alone) up to 2 * LEVEL_POINTS, else points / LEVEL_POINTS rounded up to a power of 2 (a live
    run's panels are laid out again only when it doubles)."""
    wanted = points / LEVEL_POINTS
    return 1 if wanted <= 2 else 2 ** math.ceil(math.log2(wanted))


def level_weight(weight: float, window: int) -> float:
    """The EMA weight a SMOOTHED panel uses: the slider's, or heavier to average over `window` points;
    0 (the user asked for raw values) stays 0."""
    return weight if weight <= 0 or window <= 1 else max(weight, 1.0 - 1.0 / window)


@dataclass(frozen=True)
class Panel:
    key: str
    """"loss", "val", a KNOWN column, or another logged metric's name."""
    columns: tuple[str, ...]
    title: str
    smooth: bool = False
    log_able: bool = False
    """Log-y applies (loss-like values)."""
    from_zero: bool = False
    """The y axis starts at 0: an amount, where a 1 MiB change on 500 MiB fitted to the panel's height
    looked like a leak (peak memory)."""
    window: int = 1
    """A SMOOTHED panel's least EMA window in steps (level_window; 1: the slider's weight)."""


@dataclass
class Spec:
    """One series to draw: its full data, how, and what the legend and the hover call it."""

    key: str
    kind: str
    """"line" (reduced for drawing), "band" (y low, y2 high), "points" (evals: every point) or "note"."""
    x: np.ndarray
    y: np.ndarray
    label: str
    style: dict[str, Any] = field(default_factory=dict)
    y2: np.ndarray | None = None
    raw: np.ndarray | None = None
    """For a smoothed line: the raw values, which the hover gives too."""
    stable: int | None = None
    """Leading points that cannot change any more (None: all)."""


@dataclass
class Views:
    """The caches a live figure keeps between refreshes (a static figure uses a fresh one)."""

    smoother: Smoother = field(default_factory=Smoother)
    bands: BandCache = field(default_factory=BandCache)


def loss_column(data: MetricData) -> str | None:
    """The training loss the job logged: loss, train_loss, ... or another column ending in "loss"."""
    return pick_loss(data.columns(), data.has)


def pick_loss(names: Sequence[str], has: Callable[[str], bool]) -> str | None:
    """The training loss among `names` (columns; `has`: whether one holds a value): the first of
    LOSS_NAMES, else another name ending in "loss" that is neither an eval metric nor bookkeeping.
    The one rule for the dashboard's loss panel, compare(), runs() and the end-of-run table."""
    for name in LOSS_NAMES:
        if name in names and has(name):
            return name
    for name in names:
        if name.endswith("loss") and not name.startswith(EVAL_PREFIXES) and name not in HIDDEN and has(name):
            return name
    return None


def eval_columns(data: MetricData) -> tuple[list[str], list[str]]:
    """(columns of the eval events, eval-like columns in the metrics records: val_loss logged by a
    Lightning or Accelerate job)."""
    evals = data.evals
    events = [] if evals is None or not len(evals) else [
        str(c) for c in evals.columns if str(c).startswith(EVAL_PREFIXES) and evals[c].notna().any()
        and evals[c].dtype.kind in "biuf"]
    logged = [c for c in data.columns() if c.startswith(EVAL_PREFIXES) and c not in events and data.has(c)]
    return events, logged


def choose_panels(data: MetricData, wanted: tuple[str, ...] | None = None) -> list[Panel]:
    """The panels with data, in reading order: loss, validation, lr, step time, throughput, memory,
    then any other metric the job logged.  `wanted` limits them to those keys (or metric names)."""
    panels = []
    loss = loss_column(data)
    if loss is not None:
        panels.append(Panel("loss", (loss,), f"training loss · {loss}", smooth=True, log_able=True))
    events, logged = eval_columns(data)
    if events or logged:
        names = [*events, *logged]
        title = "validation · " + ", ".join(names[:3]) + ("…" if len(names) > 3 else "")
        panels.append(Panel("val", tuple(names), title, log_able=True))
    for column, title in KNOWN.items():
        if data.has(column):
            window = level_window(max((len(c[column]) for c in data.ranks.values() if column in c), default=0)) \
                if column in SMOOTHED else 1
            title += f" · EMA ≥{window}" if window > 1 else ""  # steps; short: a panel is ~300 px
            panels.append(Panel(column, (column,), title, smooth=column in SMOOTHED, from_zero=column in FROM_ZERO,
                                window=window))
    taken = {c for p in panels for c in p.columns} | HIDDEN
    for name in data.columns():
        if name not in taken and not name.startswith(EVAL_PREFIXES) and data.has(name):
            panels.append(Panel(name, (name,), name, smooth=True, log_able=name.endswith("loss")))
    if wanted is not None:
        panels = [p for p in panels if p.key in wanted or set(p.columns) & set(wanted)]
    return panels[:MAX_PANELS]


def panel_specs(panel: Panel, data: MetricData, x: str, opts: Any, views: Views, theme_fg: str) -> list[Spec]:
    """Every series `panel` draws, from the full data (`opts`: PlotOptions)."""
    if panel.key == "val":
        return _eval_specs(panel, data, x)
    ranks = [r for r in sorted(data.ranks) if opts.ranks is None or r in opts.ranks]
    column = panel.columns[0]
    ranks = [r for r in ranks if column in data.ranks[r]]
    if not ranks:
        return []
    weight = level_weight(opts.smooth, panel.window) if panel.smooth else 0.0
    envelope = panel.key in SMOOTHED
    if panel.key == "lr":
        r = ranks[0]
        return [Spec("lr", "line", data.x(r, x), np.asarray(data.ranks[r]["lr"], float), "lr (every rank)",
                     {"color": theme_fg, "lw": 1.3})]
    if len(ranks) > BAND_ABOVE_RANKS:
        specs = _band_specs(panel, data, ranks, x, weight, views, theme_fg, envelope)
    else:
        specs = []
        for r in ranks:
            specs += _line_specs(f"{panel.key}/rank {r}", data.x(r, x), np.asarray(data.ranks[r][column], float),
                                 f"rank {r}", {"color": rank_colour(r)}, weight, views, envelope=envelope)
    if panel.key == "loss" and len(data.ranks) > 1:
        specs += _reduced_specs(panel, data, ranks, x, weight, views, theme_fg)
    return specs


def _line_specs(key: str, x: np.ndarray, y: np.ndarray, label: str, style: dict[str, Any], weight: float,
                views: Views, stable: int | None = None, gid: str | None = None, envelope: bool = False) -> list[Spec]:
    """The series, smoothed when asked with the raw one faint behind it: a line, or (`envelope`) a band
    from the smoothed value to the raw one at each point (ENVELOPE_ALPHA)."""
    if weight <= 0:
        return [Spec(key, "line", x, y, label, {"lw": 1.3, **style, "gid": gid}, stable=stable)]
    smooth = views.smoother(key, y, weight, stable)
    line = Spec(key, "line", x, smooth, label, {"lw": 1.4, **style, "gid": gid}, raw=y, stable=stable)
    if envelope:
        colour = style.get("color", "#888")  # its outline too: a one-step spike is a stroke, not a sliver of fill
        band = {"color": colour, "alpha": ENVELOPE_ALPHA, "lw": 0.5, "edgecolor": colour}
        return [Spec(key + "/raw", "band", x, np.fmin(y, smooth), "_raw " + label, band, y2=np.fmax(y, smooth),
                     stable=stable), line]
    return [Spec(key + "/raw", "line", x, y, "_raw " + label, {"lw": 0.8, "alpha": RAW_ALPHA, **style}, stable=stable),
            line]


def _band_specs(panel: Panel, data: MetricData, ranks: list[int], x: str, weight: float, views: Views,
                fg: str, envelope: bool = False) -> list[Spec]:
    column = panel.columns[0]
    shown = MetricData({r: data.ranks[r] for r in ranks}, samples_per_step=data.samples_per_step, batches=data.batches,
                       origin=data.origin_time() if x == "elapsed_s" else data.origin)
    band: Band = views.bands(shown, column, x) if set(ranks) == set(data.ranks) else BandCache()(shown, column, x)
    specs = [Spec(f"{panel.key}/band", "band", band.x, band.low, f"min-max of {len(ranks)} ranks",
                  {"color": "#888", "alpha": 0.3, "lw": 0}, y2=band.high, stable=band.stable)]
    specs += _line_specs(f"{panel.key}/median", band.x, band.median, "median", {"color": fg}, weight, views,
                         stable=band.stable)  # the min-max band is behind it already: its raw stays a line
    for r in band.outliers:  # named at their line's end, not in the legend (which then stays put)
        specs += _line_specs(f"{panel.key}/rank {r}", data.x(r, x), np.asarray(data.ranks[r][column], float),
                             f"_outlier rank {r}", {"color": rank_colour(r)}, weight, views, gid=f"rank {r}",
                             envelope=envelope)
        specs.append(Spec(f"{panel.key}/name {r}", "note", data.x(r, x), np.asarray(data.ranks[r][column], float),
                          f"rank {r}", {"color": rank_colour(r)}))
    return specs


def _reduced_specs(panel: Panel, data: MetricData, ranks: list[int], x: str, weight: float, views: Views,
                   fg: str) -> list[Spec]:
    """The loss reduced across ranks: loss_reduced as the lowest rank logged it (every rank logs the
    same value), else the mean of the ranks' losses per step."""
    first = min(data.ranks)
    cols = data.ranks[first]
    style = {"color": fg, "ls": "--"}
    if "loss_reduced" in cols and np.isfinite(np.asarray(cols["loss_reduced"], float)).any():
        return _line_specs("loss/reduced", data.x(first, x), np.asarray(cols["loss_reduced"], float),
                           "reduced (all ranks)", style, weight, views)
    band = views.bands(data, panel.columns[0], x)
    return _line_specs("loss/reduced", band.x, band.mean, "mean of the ranks", style, weight, views, stable=band.stable)


def _eval_specs(panel: Panel, data: MetricData, x: str) -> list[Spec]:
    specs = []
    evals = data.evals
    for i, column in enumerate(panel.columns[:6]):
        colour = EVAL_COLOURS[i % len(EVAL_COLOURS)]
        if evals is not None and column in evals:
            axis = x if x in evals else "step"
            rows = evals[[axis, column]].dropna()
            xs, ys = rows[axis].to_numpy(float), rows[column].to_numpy(float)
        else:  # logged in the metrics records: the lowest rank's
            rank = min(r for r, c in data.ranks.items() if column in c)
            xs, ys = data.x(rank, x), np.asarray(data.ranks[rank][column], float)
            ok = np.isfinite(ys)
            xs, ys = xs[ok], ys[ok]
        specs.append(Spec(f"val/{column}", "points", xs, ys, column,
                          {"color": colour, "marker": "o", "ms": 3.5, "lw": 1.3}))
    return specs


RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
EVAL_COLOURS = ("#00897b", "#c2185b", "#5d4037", "#512da8", "#f9a825", "#455a64")
"""Eval metrics' colours: apart from the ranks' (a val line is not a rank)."""


def rank_colour(rank: int) -> str:
    """The colour of rank `rank` everywhere: lines, badges, logs."""
    return RANK_COLOURS[int(rank) % len(RANK_COLOURS)]


def spans_a_decade(specs: list[Spec]) -> bool:
    """Whether the panel's positive values span more than a factor of 10: log-y reads better.  Values at
    or below 0 do not count (a log axis leaves them out, and says so: not_drawn_on_log)."""
    lows, highs = [], []
    for spec in specs:
        if spec.kind in ("line", "points", "band") and len(spec.y):
            y = np.asarray(spec.y, float)
            high = y if spec.y2 is None else np.asarray(spec.y2, float)
            if (y > 0).any():
                lows.append(float(y[y > 0].min()))
            if (high > 0).any():
                highs.append(float(high[high > 0].max()))
    return bool(lows) and max(highs) > 10 * min(lows)


def has_positive(specs: list[Spec]) -> bool:
    """Whether any value drawn is above 0 (a log axis has something to show)."""
    return any(spec.kind in ("line", "points", "band") and bool((np.asarray(spec.y, float) > 0).any())
               for spec in specs)


def not_drawn_on_log(specs: list[Spec]) -> int:
    """How many logged values a log-y panel leaves out: those at or below 0 (a loss of exactly 0.0), counted
    in the series as logged (a smoothed line's raw one, a band's lows), not in their smoothed copies."""
    count = 0
    for spec in specs:
        if spec.kind in ("line", "points", "band") and spec.raw is None and len(spec.y):
            count += int((np.asarray(spec.y, float) <= 0).sum())
    return count
