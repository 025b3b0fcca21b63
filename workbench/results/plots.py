"""matplotlib figures of a run (no widgets): its panels, drawn at full fidelity.

``plot_run`` draws only the panels the run has data for, named after the metrics the job logged
(training loss as `loss` or `train_loss`, the eval metrics, lr, step time, throughput, peak memory,
any other metric), against step, samples seen or elapsed time.  Readable by default: the loss and the
noisy per-step series are smoothed (TensorBoard's EMA, weight 0.6) with the raw series faint behind,
log-y when a loss spans more than a decade, one legend outside the data, x linked across panels.
Above BAND_ABOVE_RANKS ranks a panel shows the median across ranks with a min-max band plus the ranks
that stray from it.  Rank R has the same colour (``rank_colour``) in every panel, in the dashboard's
badges and in its log picker.

Every series is drawn through ``workbench.results.m4``: the full series (smoothed first) is reduced
to the first, last, min and max point of each pixel column when it is drawn, so a spike the data has
is a spike the figure shows, however many steps were logged.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure

from workbench.errors import ArgumentError
from workbench.results.m4 import M4Band, M4Line
from workbench.results.metricview import X_AXES
from workbench.results.panels import (  # noqa: F401 - RANK_COLOURS, rank_colour: re-exported
    RANK_COLOURS,
    Panel,
    Spec,
    Views,
    choose_panels,
    has_positive,
    not_drawn_on_log,
    panel_specs,
    rank_colour,
    spans_a_decade,
)
from workbench.results.series import MetricData

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

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
READABLE = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10.5,
            "xtick.labelsize": 10.5, "ytick.labelsize": 10.5, "axes.grid": True, "grid.linewidth": 0.6,
            "axes.formatter.limits": (-4, 5)}
"""Sizes that stay readable at 100 dpi (ticks ~14 px high)."""
DEFAULT_SMOOTH = 0.6
"""TensorBoard's default smoothing weight."""


class ShownFigure(Figure):
    """A Figure that shows itself in a notebook without pyplot (a bare Figure's repr is only
    `<Figure size ...>` until pyplot's inline backend is loaded)."""

    def _repr_png_(self) -> bytes:
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg

        if self.canvas is None or type(self.canvas).__name__ == "FigureCanvasBase":
            FigureCanvasAgg(self)
        out = io.BytesIO()
        self.savefig(out, format="png", dpi=self.dpi)
        return out.getvalue()


@dataclass(frozen=True)
class PlotOptions:
    x: str = "step"
    """"step", "samples" (seen by all ranks together) or "elapsed_s"."""
    log_y: bool | None = None
    """Log-y on the loss and validation panels: True, False, or None (auto: when the values span
    more than a decade)."""
    smooth: float = DEFAULT_SMOOTH
    """EMA weight, 0 (raw) to 0.999 (heavy), as TensorBoard's smoothing slider; applies to the loss,
    step time, throughput and other logged metrics, over the full series."""
    ranks: tuple[int, ...] | None = None
    """The ranks to draw (None: all)."""
    theme: str = "light"
    panels: tuple[str, ...] | None = None
    """Panel keys or metric names to draw (None: every panel with data)."""


def options(**given: Any) -> PlotOptions:
    """PlotOptions from keyword arguments, checked: one ValueError naming the field and the fix."""
    unknown = sorted(set(given) - set(PlotOptions.__dataclass_fields__))
    if unknown:
        raise ArgumentError(f"plot option {unknown[0]!r} is not one of {', '.join(PlotOptions.__dataclass_fields__)}")
    opts = PlotOptions(**given)
    if opts.x not in X_AXES:
        raise ArgumentError(f"x: {opts.x!r} is not one of {', '.join(X_AXES)}")
    if not 0.0 <= float(opts.smooth) < 1.0:
        raise ArgumentError(f"smooth: {opts.smooth!r} is not an EMA weight; give 0 (raw) to 0.999")
    if opts.theme not in THEMES:
        raise ArgumentError(f"theme: {opts.theme!r} is not one of {', '.join(THEMES)}")
    if opts.panels is not None and isinstance(opts.panels, str):
        raise ArgumentError(f"panels: give a list of panel names, e.g. [{opts.panels!r}]")
    return opts


def as_data(frame: pd.DataFrame | MetricData | None, evals: pd.DataFrame | None = None) -> MetricData:
    if isinstance(frame, MetricData):
        if evals is not None:
            frame.evals = evals
        return frame
    import pandas as pd

    return MetricData.from_frame(frame if frame is not None else pd.DataFrame(), evals)


def plot_run(frame: pd.DataFrame | MetricData, panels: Sequence[str] | None = None,
             figsize: tuple[float, float] | None = None, fig: Figure | None = None,
             evals: pd.DataFrame | None = None, columns: int = 3, fixed_layout: bool = False,
             **opts: Any) -> Figure:
    """The run's panels as a matplotlib Figure; `opts` are PlotOptions fields (x, log_y, smooth,
    ranks, theme); `evals` are the run's eval events (Run.evals()).  The panels are laid out by
    matplotlib's constrained layout, or with `fixed_layout` by fixed margins (FIXED_MARGINS_IN: a
    third of the drawing time, for a figure drawn once, as the CLI's PNG)."""
    o = options(**opts, panels=tuple(panels) if panels is not None else None)
    data = as_data(frame, evals)
    chosen = choose_panels(data, o.panels)
    ncols = max(1, min(columns, len(chosen)))
    nrows = max(1, math.ceil(len(chosen) / ncols))
    with theme_rc(o.theme):
        fig = fig or ShownFigure(figsize=figsize or (11.0, 0.5 + 2.9 * nrows),
                                 layout=None if fixed_layout else "constrained")
        fig.clear()
        if fixed_layout:
            fig.subplots_adjust(**fixed_margins(fig, nrows, ncols))
        fig.set_facecolor(THEMES[o.theme]["figure.facecolor"])
        axes = panel_axes(fig, len(chosen), ncols)
        views, x = Views(), data.axis(o.x)
        for ax, panel in zip(axes, chosen):
            specs = panel_specs(panel, data, x, o, views, FOREGROUND[o.theme])
            add_artists(ax, specs)
            if panel.from_zero:
                from_zero(ax)
            decorate(ax, panel, specs, o, x, note_hidden=True)
        legend = figure_legend(fig, axes)
        if fixed_layout:
            fit_legend_rows(fig, legend)
        if not chosen:
            fig.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", fontsize=13)
    return fig


def from_zero(ax: Axes) -> None:
    """A panel of amounts (Panel.from_zero) from 0 up to its data plus the live figure's 6%: a flat series
    (the same peak memory every step, autoscaled to a sliver around it) was drawn on the panel's top edge."""
    low, high = ax.get_ylim()
    bottom, top = min(0.0, low), ax.dataLim.y1
    if np.isfinite(top):
        high = max(high, top + 0.06 * (top - bottom))
    ax.set_ylim(bottom, high)


FIXED_MARGINS_IN = {"left": 0.8, "right": 0.25, "top": 0.75, "bottom": 0.6, "wspace": 1.0, "hspace": 0.65}
LEGEND_COLUMNS = 9
LEGEND_ROW_IN = 0.28
"""Margins of a fixed layout, in inches: room for tick labels of up to ~7 characters at READABLE's
sizes, a panel's title and, at the top, the legend's row."""


def fixed_margins(fig: Figure, nrows: int, ncols: int) -> dict[str, float]:
    """FIXED_MARGINS_IN as subplots_adjust's fractions of this figure."""
    width, height = fig.get_size_inches()
    m = FIXED_MARGINS_IN
    panel_w = (width - m["left"] - m["right"] - (ncols - 1) * m["wspace"]) / ncols
    panel_h = (height - m["top"] - m["bottom"] - (nrows - 1) * m["hspace"]) / nrows
    return {"left": m["left"] / width, "right": 1 - m["right"] / width, "top": 1 - m["top"] / height,
            "bottom": m["bottom"] / height, "wspace": m["wspace"] / max(panel_w, 0.1),
            "hspace": m["hspace"] / max(panel_h, 0.1)}


def fit_legend_rows(fig: Figure, legend: Any, right_px: float = 0.0) -> None:
    """With fixed margins: room at the top for each row of the legend beyond the first (`right_px`:
    as figure_legend was given)."""
    if legend is None:
        return
    labels = [t.get_text() for t in legend.get_texts()]
    rows = math.ceil(len(labels) / legend_columns(fig, labels, legend_share(fig, right_px)))
    extra = LEGEND_ROW_IN * (rows - 1)
    if extra > 0:
        fig.subplots_adjust(top=1 - (FIXED_MARGINS_IN["top"] + extra) / fig.get_figheight())


def panel_axes(fig: Figure, n: int, ncols: int) -> list[Axes]:
    """n axes in rows of ncols, x shared (a zoom or pan moves every panel), x labels on the bottom row."""
    if n == 0:
        return []
    nrows = math.ceil(n / ncols)
    grid = fig.add_gridspec(nrows, ncols)
    axes: list[Axes] = []
    for i in range(n):
        axes.append(fig.add_subplot(grid[i // ncols, i % ncols], sharex=axes[0] if axes else None))
    for i, ax in enumerate(axes):
        if i + ncols < n:  # a panel below it: its x tick labels would repeat the one below
            ax.tick_params(labelbottom=False)
    return axes


_RC_LOCK = threading.RLock()
"""matplotlib's rcParams are one global: two dashboards drawing at once from their poll threads, each in
its own theme's rc_context, would restore each other's settings out of order (one drew with the
other's colours, and the last to leave left its theme in every later plot of the kernel).  Held for
the whole of a themed draw."""


@contextmanager
def theme_rc(theme: str) -> Iterator[None]:
    import matplotlib

    if theme not in THEMES:
        raise ArgumentError(f"theme: {theme!r} is not one of {', '.join(THEMES)}")
    rc: dict[str, Any] = {**READABLE, **THEMES[theme]}
    with _RC_LOCK, matplotlib.rc_context(rc):  # type: ignore[arg-type]  # keys are rcParams names
        yield


# --- specs -> artists ------------------------------------------------------------------------------
def add_artists(ax: Axes, specs: list[Spec]) -> dict[str, Any]:
    """An artist per spec (key -> artist), added to `ax`."""
    made = {}
    for spec in specs:
        made[spec.key] = make_artist(ax, spec)
    ax.autoscale_view()
    return made


def make_artist(ax: Axes, spec: Spec) -> Any:
    style = {k: v for k, v in spec.style.items() if v is not None}
    if spec.kind == "band":
        band = M4Band(spec.x, spec.y, spec.y2 if spec.y2 is not None else spec.y, label=spec.label,
                      facecolor=style.pop("color", "#888"), **style)
        ax.add_collection(band, autolim=False)
        ax.update_datalim(band.get_datalim(ax.transData))
        return band
    if spec.kind == "note":
        xy = last_point(spec.x, spec.y)
        note = ax.annotate(spec.label, xy or (0.0, 0.0), color=style.get("color"), fontsize=9.5, xytext=(3, 0),
                           textcoords="offset points", va="center", annotation_clip=True)
        note.set_visible(xy is not None)
        return note
    if spec.kind == "points":
        return ax.plot(spec.x, spec.y, label=spec.label, **style)[0]
    line = M4Line(spec.x, spec.y, raw=spec.raw, label=spec.label, **style)
    ax.add_line(line)
    return line


def update_artist(artist: Any, spec: Spec) -> None:
    """Give an artist made from a spec with the same key its new data."""
    if spec.kind == "band":
        artist.set_full(spec.x, spec.y, spec.y2 if spec.y2 is not None else spec.y, spec.stable)
    elif spec.kind == "note":
        xy = last_point(spec.x, spec.y)
        if xy is not None:
            artist.xy = xy
        artist.set_visible(xy is not None)
    elif spec.kind == "points":
        artist.set_data(spec.x, spec.y)
    else:
        artist.set_full(spec.x, spec.y, spec.stable, spec.raw)


def last_point(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    ok = np.flatnonzero(np.isfinite(np.asarray(x, float)) & np.isfinite(np.asarray(y, float)))
    return (float(x[ok[-1]]), float(y[ok[-1]])) if len(ok) else None


def decorate(ax: Axes, panel: Panel, specs: list[Spec], opts: PlotOptions, x: str, note_hidden: bool = False) -> None:
    """Title (the metric's name), x label, log scale; `note_hidden` (a figure drawn once): a note inside the
    panel's top right says how many values log-y leaves out (in the title it ran into the next panel's;
    a live figure says it on its range line, which follows the data)."""
    ax.set_title(panel.title, loc="left")
    if ax.xaxis.get_tick_params().get("labelbottom", True) is not False:
        ax.set_xlabel(X_AXES.get(x, x))
    if use_log(panel, specs, opts):
        ax.set_yscale("log", nonpositive="mask")  # a value <= 0 is left out (and counted), not clipped
        hidden = not_drawn_on_log(specs) if note_hidden else 0
        if hidden:
            ax.text(0.98, 0.97, hidden_text(hidden), transform=ax.transAxes, ha="right", va="top", fontsize="small",
                    color=FOREGROUND[opts.theme], gid="wb-not-drawn")
    if x == "step" or x == "samples":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))


def use_log(panel: Panel, specs: list[Spec], opts: PlotOptions) -> bool:
    """Log-y where the user asked for it, or (automatic) where the positive values span a decade.  A value
    at or below 0 (one loss of exactly 0.0 in 20,000 steps) neither overrides the user's choice nor turns
    the automatic choice off: the log axis leaves it out, and the figure says how many it left out."""
    if not panel.log_able or opts.log_y is False or not has_positive(specs):
        return False
    return opts.log_y is True or spans_a_decade(specs)


def hidden_text(count: int) -> str:
    return f"{count} value{'s' if count != 1 else ''} <= 0 not drawn on log y"


def figure_legend(fig: Figure, axes: Sequence[Axes], right_px: float = 0.0) -> Any:
    """One legend above the panels (outside the data): each label once (rank R has one colour in
    every panel).  `right_px`: pixels at the figure's top right it keeps clear (the live figure's
    toolbar shows there)."""
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if not handles:
        return None
    share = legend_share(fig, right_px)
    where = {"bbox_to_anchor": (0.0, 0.0, share, 1.0), "bbox_transform": fig.transFigure} if share < 1 else {}
    return fig.legend(handles, labels, loc="outside upper center", ncols=legend_columns(fig, labels, share),
                      frameon=False, handlelength=1.6, columnspacing=1.2, **where)


def legend_share(fig: Figure, right_px: float) -> float:
    """The part of the figure's width the legend may take, `right_px` kept clear at its right."""
    return max(0.4, 1.0 - right_px / fig.bbox.width) if right_px > 0 else 1.0


def legend_columns(fig: Figure, labels: Sequence[str], share: float = 1.0) -> int:
    """Columns of the legend: up to LEGEND_COLUMNS, as many as fit `share` of the figure's width
    (labels of this length at the legend's font size)."""
    longest = max((len(label) for label in labels), default=1)
    column_in = 0.55 + 0.075 * longest  # handle and gaps, then ~0.075 in a character at 10.5 pt
    fit = int(fig.get_figwidth() * share / column_in)
    return max(1, min(len(labels), LEGEND_COLUMNS, fit))


def _line(ax: Axes, x: np.ndarray, y: np.ndarray, colour: str, label: str, opts: PlotOptions, **style: Any) -> None:
    """One series on `ax` (workbench.compare's runs): smoothed when opts say so, the raw one faint
    behind, drawn at full fidelity."""
    from workbench.results.panels import _line_specs

    for spec in _line_specs(label, np.asarray(x, float), np.asarray(y, float), label, {"color": colour, **style},
                            opts.smooth, Views()):
        make_artist(ax, spec)
    ax.autoscale_view()


def save_run_plot(frame: pd.DataFrame | MetricData, path: str, **kwargs: Any) -> str:
    """The run's figure as a file (the CLI's plots/loss.png): laid out with fixed margins and drawn
    once (kwargs: plot_run's)."""
    save_figure(plot_run(frame, fixed_layout=True, **kwargs), path)
    return path


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write `fig` as a private file (0600, workbench.runfolder.private), in the format its suffix
    names; a PNG is drawn once by Agg (no pyplot, no second draw)."""
    from workbench.runfolder.private import replacing

    fmt = Path(path).suffix.lstrip(".") or "png"
    with replacing(path) as fh:  # written beside and renamed: a link in its place is replaced
        if fmt == "png" and fig.dpi == 100:
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            FigureCanvasAgg(fig).print_png(fh)
        else:
            fig.savefig(fh, dpi=100, format=fmt)


SPLIT = (("data_time_s", "data wait"), ("compute_s", "compute"), ("comm_wait_s", "communication"))


def plot_scaling(frame: pd.DataFrame, figsize: tuple[float, float] = (10.0, 3.6)) -> Figure:
    """Measured scaling (from benchmark_scaling): speedup measured vs ideal vs the guides' expectation,
    and per world size the step split into data wait, compute and communication, efficiency on top."""
    fig = ShownFigure(figsize=figsize, layout="constrained")
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
