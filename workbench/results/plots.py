"""matplotlib figures from metrics DataFrames (no widgets).

``plot_run`` draws a run's panels (training loss, validation metrics, lr, step time, throughput,
peak memory) against step, samples seen or elapsed time, with optional log-y and EMA smoothing (the
raw series faint behind).  Above BAND_ABOVE_RANKS ranks a panel shows the median across ranks with
a min-max band plus the ranks that stray from it, not one line per rank.  Rank R has the same
colour (``rank_colour``) in every panel, in the dashboard's badges and in its log picker.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.results.metricview import BAND_ABOVE_RANKS, X_AXES, band, ema, reduced_loss
from workbench.runfolder.reader import thin

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANELS = ("loss", "val", "lr", "step_time_s", "samples_per_s", "mem_mb")
TITLES = {"loss": "training loss", "val": "validation (eval events)", "lr": "learning rate",
          "step_time_s": "step time (s)", "samples_per_s": "samples/s per rank", "mem_mb": "peak memory (MiB)"}
LOG_PANELS = ("loss", "val")
"""Panels that log-y applies to."""
RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
THEMES = {
    "light": {"figure.facecolor": "white", "axes.facecolor": "white", "text.color": "#222",
              "axes.labelcolor": "#222", "axes.edgecolor": "#888", "xtick.color": "#333", "ytick.color": "#333",
              "grid.color": "#ddd", "legend.facecolor": "white", "legend.edgecolor": "#ccc"},
    "dark": {"figure.facecolor": "#212121", "axes.facecolor": "#212121", "text.color": "#eee",
             "axes.labelcolor": "#eee", "axes.edgecolor": "#999", "xtick.color": "#ddd", "ytick.color": "#ddd",
             "grid.color": "#444", "legend.facecolor": "#303030", "legend.edgecolor": "#666"},
}
"""Figure colours for JupyterLab's light and dark themes (text contrast >= 7:1 on both)."""
FOREGROUND = {"light": "#222", "dark": "#eee"}
READABLE = {"font.size": 10.5, "axes.titlesize": 11.5, "axes.labelsize": 10.5, "legend.fontsize": 9,
            "xtick.labelsize": 9.5, "ytick.labelsize": 9.5, "axes.grid": True, "grid.linewidth": 0.6}
"""Sizes that stay readable in a 1100 px wide window."""


def rank_colour(rank: int) -> str:
    """The colour of rank `rank` everywhere: lines, badges, logs."""
    return RANK_COLOURS[int(rank) % len(RANK_COLOURS)]


@dataclass(frozen=True)
class PlotOptions:
    x: str = "step"
    """"step", "samples" (seen by all ranks together) or "elapsed_s"."""
    log_y: bool = False
    smooth: float = 0.0
    """EMA weight, 0 (raw) to 0.99 (heavy), as TensorBoard's smoothing slider."""
    ranks: tuple[int, ...] | None = None
    """The ranks to draw (None: all)."""
    theme: str = "light"
    max_points: int = 2000
    """Points per line at most (each bucket's min and max are kept: spikes stay visible)."""
    panels: tuple[str, ...] = field(default=PANELS)


def plot_run(frame: pd.DataFrame, panels: Sequence[str] = PANELS, max_points: int = 2000,
             figsize: tuple[float, float] | None = None, fig: Figure | None = None,
             evals: pd.DataFrame | None = None, **options: Any) -> Figure:
    """The run's panels as a matplotlib Figure; `options` are PlotOptions fields (x, log_y, smooth,
    ranks, theme); `evals` are the run's eval events (Run.events() rows with event == "eval")."""
    from matplotlib.figure import Figure

    opts = PlotOptions(max_points=max_points, panels=tuple(panels),
                       **{k: v for k, v in options.items() if k in PlotOptions.__dataclass_fields__})
    ncols = min(3, len(opts.panels))
    nrows = math.ceil(len(opts.panels) / ncols)
    with theme_rc(opts.theme):
        fig = fig or Figure(figsize=figsize or (11.0, 3.1 * nrows), layout="constrained")
        fig.clear()
        fig.set_facecolor(THEMES[opts.theme]["figure.facecolor"])
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, panel in zip(axes, opts.panels):
            draw_panel(ax, panel, frame, evals, opts)
        for ax in axes[len(opts.panels):]:
            ax.set_visible(False)
    return fig


@contextmanager
def theme_rc(theme: str) -> Iterator[None]:
    import matplotlib

    if theme not in THEMES:
        raise ValueError(f"theme: {theme!r} is not one of {', '.join(THEMES)}")
    rc: dict[str, Any] = {**READABLE, **THEMES[theme]}
    with matplotlib.rc_context(rc):  # type: ignore[arg-type]  # keys are rcParams names
        yield


def draw_panel(ax: Axes, panel: str, frame: pd.DataFrame, evals: pd.DataFrame | None, opts: PlotOptions) -> None:
    draw_data(ax, panel, frame, evals, opts)
    decorate(ax, panel, frame, evals, opts)


def draw_data(ax: Axes, panel: str, frame: pd.DataFrame, evals: pd.DataFrame | None,
              opts: PlotOptions) -> list[Any]:
    """The panel's data artists (lines, bands), returned so a live view can redraw just them."""
    before = set(ax.lines) | set(ax.collections) | set(ax.texts)
    x = opts.x if opts.x in frame else "step"
    if panel == "val":
        _draw_evals(ax, evals, opts)
    elif not len(frame) or panel not in frame or x not in frame:
        pass
    elif panel == "lr":
        first = frame[frame["rank"] == frame["rank"].min()]
        ax.plot(*envelope(first[x].to_numpy(float), first["lr"].to_numpy(float), min(opts.max_points, DRAW_POINTS)),
                color=FOREGROUND[opts.theme], lw=1.2, label="lr (every rank)")
    else:
        _draw_ranks(ax, frame, panel, x, opts)
        if panel == "loss":
            _draw_reduced(ax, frame, x, opts)
    return [a for a in [*ax.lines, *ax.collections, *ax.texts] if a not in before]


def decorate(ax: Axes, panel: str, frame: pd.DataFrame, evals: pd.DataFrame | None, opts: PlotOptions) -> None:
    """Title, axis label, log scale and legend (what a live view keeps in its cached background)."""
    x = opts.x if opts.x in frame else "step"
    title = TITLES.get(panel, panel)
    if not ax.has_data():
        title += ": none yet" if panel == "val" else ": no data yet"
    ax.set_title(title, loc="left")
    ax.set_xlabel(X_AXES.get(x, x))
    if opts.log_y and panel in LOG_PANELS and ax.has_data():
        ax.set_yscale("log")
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(loc="upper right", ncols=2 if len(handles) > 5 else 1)


def selected(frame: pd.DataFrame, ranks: Sequence[int] | None) -> pd.DataFrame:
    return frame if ranks is None else frame[frame["rank"].isin(list(ranks))]


def _draw_ranks(ax: Axes, frame: pd.DataFrame, column: str, x: str, opts: PlotOptions) -> None:
    data = selected(frame, opts.ranks)
    ranks = sorted(data["rank"].unique())
    rank_of, xs, ys = data["rank"].to_numpy(), data[x].to_numpy(float), data[column].to_numpy(float)  # numpy
    # masks per rank: pandas' boolean indexing costs ~1 ms a call, and a wide run has many ranks
    if len(ranks) > BAND_ABOVE_RANKS:
        found = band(data, column, x)
        bx, low, high = _thin(found.x, found.low, found.high, n=min(opts.max_points, DRAW_POINTS))
        ax.fill_between(bx, low, high, color="#888", alpha=0.3, lw=0, label=f"min-max of {len(ranks)} ranks")
        _line(ax, found.x, found.median, FOREGROUND[opts.theme], "median", opts)
        for rank in found.outliers:  # named at their line's end, not in the legend (which then stays put)
            mine = rank_of == rank
            _line(ax, xs[mine], ys[mine], rank_colour(rank), "_outlier", opts, gid=f"rank {rank}")
            ax.annotate(f"rank {rank}", (xs[mine][-1], ys[mine][-1]), color=rank_colour(rank), fontsize=9,
                        xytext=(3, 0), textcoords="offset points", va="center")
        return
    for rank in ranks:
        mine = rank_of == rank
        _line(ax, xs[mine], ys[mine], rank_colour(rank), f"rank {rank}", opts)


def _draw_reduced(ax: Axes, frame: pd.DataFrame, x: str, opts: PlotOptions) -> None:
    reduced = reduced_loss(frame, x)
    _line(ax, reduced[x].to_numpy(float), reduced["loss"].to_numpy(float), FOREGROUND[opts.theme],
          "reduced (all ranks)", opts, ls="--")


def _draw_evals(ax: Axes, evals: pd.DataFrame | None, opts: PlotOptions) -> None:
    columns = [] if evals is None else [c for c in evals.columns if c.startswith("val_")]
    x = opts.x if evals is not None and opts.x in evals else "step"
    if not columns or evals is None or not len(evals):
        return
    for i, column in enumerate(columns[:6]):
        rows = evals[[x, column]].dropna()
        ax.plot(rows[x], rows[column], "o-", ms=3, lw=1.2, color=RANK_COLOURS[(i + 3) % len(RANK_COLOURS)],
                label=column)


DRAW_POINTS = 700
"""Points drawn per line at most: about two per pixel column of a panel (~350 px); each bucket's min
and max are kept, so it looks the same, and drawing costs what the pixels need, not what was logged."""


def _line(ax: Axes, x: np.ndarray, y: np.ndarray, colour: str, label: str, opts: PlotOptions, **style: Any) -> None:
    """The series, smoothed when asked (the raw one faint behind it), at most DRAW_POINTS points."""
    from matplotlib.lines import Line2D

    points = min(opts.max_points, DRAW_POINTS)
    if opts.smooth > 0:  # Line2D + add_line: ax.plot's argument parsing costs more than the line itself
        ax.add_line(Line2D(*envelope(x, y, points), color=colour, lw=0.8, alpha=0.25, label="_raw", **style))
        y = ema(y, opts.smooth)
    ax.add_line(Line2D(*envelope(x, y, points), color=colour, lw=1.3, label=label, **style))
    ax.autoscale_view()


def envelope(x: np.ndarray, y: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ~2 points per column: each bucket's min and max, in order (a spike stays visible)."""
    n = len(y)
    columns = max(1, columns // 2)
    if n <= 4 * columns:
        return x, y
    k = -(-n // columns)
    m = (n // k) * k
    chunks = y[:m].reshape(-1, k)
    lows = np.argmin(np.where(np.isnan(chunks), np.inf, chunks), axis=1)
    highs = np.argmax(np.where(np.isnan(chunks), -np.inf, chunks), axis=1)
    starts = np.arange(len(chunks)) * k
    keep = np.unique(np.concatenate([[0], starts + lows, starts + highs, np.arange(m, n), [n - 1]]))
    return x[keep], y[keep]


def _thin(x: np.ndarray, *ys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    stride = max(1, -(-len(x) // max(1, n)))
    low, high = ys
    return x[::stride], low[::stride], high[::stride]


def downsample(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most max_points rows per rank, evenly spaced, each rank's last row kept."""
    if len(frame) == 0 or "rank" not in frame or frame.groupby("rank").size().max() <= max_points:
        return frame
    import pandas as pd

    return pd.concat([thin(part, max_points) for _, part in frame.groupby("rank")]).sort_index()


def save_run_plot(frame: pd.DataFrame, path: str, **kwargs: Any) -> str:
    save_figure(plot_run(frame, **kwargs), path)
    return path


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write `fig` as a private file (0600, workbench.runfolder.private), in the format its suffix names."""
    from workbench.runfolder.private import open_private

    with open_private(path, "wb") as fh:
        fig.savefig(fh, dpi=100, format=Path(path).suffix.lstrip(".") or "png")


SPLIT = (("data_time_s", "data wait"), ("compute_s", "compute"), ("comm_wait_s", "communication"))


def plot_scaling(frame: pd.DataFrame, figsize: tuple[float, float] = (10.0, 3.6)) -> Figure:
    """Measured scaling (from benchmark_scaling): speedup measured vs ideal vs the guides' expectation,
    and per world size the step split into data wait, compute and communication, efficiency on top."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    speed_ax, split_ax = fig.subplots(1, 2)
    _plot_speedup(frame, speed_ax)
    _plot_split(frame, split_ax)
    return fig


def _plot_speedup(frame: pd.DataFrame, ax: Axes) -> None:
    n = frame["world_size"]
    ax.plot(n, frame["ideal_speedup"], "k--", lw=1, label="ideal")
    ax.fill_between(n, frame["expected_low"], frame["expected_high"], color="tab:green", alpha=0.2)
    ax.plot(n, frame["expected_speedup"], "-", color="tab:green", lw=1, label="guides' rule of thumb")
    ax.plot(n, frame["speedup"], "o-", color="tab:blue", lw=2, label="measured")
    ax.set_xticks(list(n))
    ax.set_xlabel("world size (ranks)")
    ax.set_title(f"speedup over {int(n.iloc[0])} rank(s)")
    ax.legend(fontsize="small")


def _plot_split(frame: pd.DataFrame, ax: Axes) -> None:
    labels = [str(int(n)) for n in frame["world_size"]]
    bottom = [0.0] * len(frame)
    for column, name in SPLIT:
        values = frame[column].fillna(0).tolist() if column in frame else [0.0] * len(frame)
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, top, eff in zip(labels, bottom, frame["efficiency"]):
        ax.annotate(f"{eff:.0%}", (x, top), ha="center", va="bottom", fontsize="small")
    ax.set_xlabel("world size (ranks); label: scaling efficiency")
    ax.set_title("median step time (s)")
    ax.legend(fontsize="small")
