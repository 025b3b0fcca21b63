"""A live matplotlib figure that is cheap to refresh: only the data is redrawn, over a cached background.

The panels are drawn by ``workbench.results.plots`` (``draw_data`` + ``decorate``).  A full draw (axes,
ticks, titles, legends: text layout is most of matplotlib's cost) happens when the options or the
legend change, or when new data leaves the axis limits (which get headroom); in between, each
refresh removes the old data artists, draws the new ones over the cached background and blits.
On the ipympl canvas (the dashboard's widget) a blit sends only the changed pixels to the browser,
and zoom, pan and the toolbar work as usual: an axis the user zoomed keeps its limits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.results.plots import PANELS, PlotOptions, decorate, draw_data, theme_rc

if TYPE_CHECKING:
    import pandas as pd

Limits = tuple[tuple[float, float], tuple[float, float]]
_NUMBERS = iter(range(10**6, 10**9))  # figure numbers for ipympl managers (never registered with pyplot)


def make_canvas(fig: Any, interactive: bool) -> Any:
    """An ipympl Canvas widget for `fig` (zoom, pan, hover), or a plain Agg canvas."""
    if not interactive:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        return FigureCanvasAgg(fig)
    try:
        from ipympl.backend_nbagg import FigureManager
    except ImportError:
        raise ImportError("interactive plots need ipympl, which is not installed: pip install \"workbench[lab]\" "
                          "(or ipympl)") from None
    canvas = _canvas_class()(fig)
    FigureManager(canvas, next(_NUMBERS))  # the toolbar and the message plumbing, outside pyplot
    canvas._size = tuple(fig.bbox.size)  # ipympl sets it only when the canvas itself is displayed
    canvas.header_visible = False
    canvas.footer_visible = True  # the toolbar's message: the x and y under the cursor
    canvas.resizable = False
    canvas.toolbar_position = "top"  # zoom, pan, home: shown while the pointer is over the figure
    return canvas


def _canvas_class() -> Any:
    """ipympl's Canvas, shown inside our own widgets rather than displayed alone.  Until the browser's
    view has said it is ready, ipympl keeps the latest image in `_data_url` for that view's first
    paint, but stores bare base64 there where the view reads a data: URL (ipympl itself adds the
    prefix only when the canvas is displayed on its own); this adds it."""
    from ipympl.backend_nbagg import Canvas

    class EmbeddedCanvas(Canvas):
        def send_binary(self, data: Any) -> None:
            super().send_binary(data)
            url: Any = getattr(self, "_data_url", None)
            if self.syncing_data_url and isinstance(url, str) and url and not url.startswith("data:"):
                self._data_url = "data:image/png;base64," + url

    return EmbeddedCanvas


class LiveFigure:
    """The run's panels on one canvas; `update()` redraws what changed and says how."""

    def __init__(self, interactive: bool = False, figsize: tuple[float, float] = (8.0, 7.4), dpi: int = 84,
                 columns: int = 2):
        from matplotlib.figure import Figure

        self.columns = columns
        """Panels per row: 2 keeps the figure ~700 px wide, readable in an 1100 px window with the
        file browser open."""
        self.fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        self.canvas = make_canvas(self.fig, interactive)
        self.opts: PlotOptions | None = None
        self.full_draws = 0
        self.line_draws = 0
        self._lock = threading.RLock()  # the poller thread and the kernel's draw (a zoom) share the renderer
        self._data: list[list[Any]] = []
        self._labels: list[tuple[str, ...]] = []
        self._set: list[Limits] = []
        self._background: Any = None
        self._fitting = False
        self.on_view: Callable[[Any], None] | None = None
        """Called with the first panel's axes whenever its x range changes (a zoom, a pan, a refit)."""
        draw = self.canvas.draw
        self.canvas.draw = lambda *a, **k: self._locked(draw, *a, **k)
        self.canvas.mpl_connect("draw_event", self._on_draw)

    def _locked(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(*args, **kwargs)

    # --- refresh ---------------------------------------------------------------------------------
    def update(self, frame: pd.DataFrame, evals: pd.DataFrame | None, opts: PlotOptions) -> str:
        """"full" (everything drawn), "lines" (data only, over the background)."""
        with self._lock, theme_rc(opts.theme):
            if opts != self.opts or not self._data:
                return self._rebuild(frame, evals, opts)
            for artists in self._data:
                for artist in artists:
                    artist.remove()
            self._data = [draw_data(ax, p, frame, evals, opts) for ax, p in zip(self.fig.axes, opts.panels)]
            if [_labels(a) for a in self._data] != self._labels:
                return self._rebuild(frame, evals, opts)  # the legend changes (an outlier rank appeared)
            if self._fit_limits() or self._background is None:
                self._full_draw()
                return "full"
            self.canvas.restore_region(self._background)
            self._draw_data()
            self.canvas.blit(self.fig.bbox)
            self.line_draws += 1
            return "lines"

    def _rebuild(self, frame: pd.DataFrame, evals: pd.DataFrame | None, opts: PlotOptions) -> str:
        from workbench.results.plots import THEMES

        self.opts = opts
        self.fig.clear()
        self.fig.set_layout_engine("constrained")
        self.fig.set_facecolor(THEMES[opts.theme]["figure.facecolor"])
        ncols = min(self.columns, len(opts.panels))
        axes = self.fig.subplots(-(-len(opts.panels) // ncols), ncols, squeeze=False).ravel()
        for ax in axes[len(opts.panels):]:
            ax.set_visible(False)
        self._data = [draw_data(ax, p, frame, evals, opts) for ax, p in zip(axes, opts.panels)]
        for ax, panel in zip(axes, opts.panels):
            decorate(ax, panel, frame, evals, opts)
        self._labels = [_labels(a) for a in self._data]
        axes[0].callbacks.connect("xlim_changed", self._view_changed)
        self._set = []
        self._fit_limits()
        self._full_draw()
        self.fig.set_layout_engine("none")  # laid out once: later draws skip the layout pass
        return "full"

    def _full_draw(self) -> None:
        for artists in self._data:
            for artist in artists:
                artist.set_animated(True)  # left out of the background, drawn over it
        self.canvas.draw()  # _on_draw caches the background and draws the data
        self.full_draws += 1

    def _on_draw(self, _event: Any) -> None:
        """After any full draw (ours, or the toolbar's zoom): cache the background, draw the data."""
        with self._lock:
            self._background = self.canvas.copy_from_bbox(self.fig.bbox)
            self._draw_data()

    def _draw_data(self) -> None:
        for ax, artists in zip(self.fig.axes, self._data):
            for artist in artists:
                ax.draw_artist(artist)

    # --- limits ----------------------------------------------------------------------------------
    def _view_changed(self, ax: Any) -> None:
        if self.on_view is not None and not self._fitting:
            self.on_view(ax)

    def _fit_limits(self) -> bool:
        """Give each axis the user has not zoomed limits with headroom when its data left them;
        returns whether any changed."""
        self._fitting = True
        try:
            changed = self._refit()
        finally:
            self._fitting = False
        if self.fig.axes:
            self._view_changed(self.fig.axes[0])
        return changed

    def _refit(self) -> bool:
        changed = False
        visible = [ax for ax in self.fig.axes if ax.get_visible()]
        if len(self._set) != len(visible):
            self._set = [((np.nan, np.nan), (np.nan, np.nan))] * len(visible)
        for i, (ax, artists) in enumerate(zip(visible, self._data)):
            now = (ax.get_xlim(), ax.get_ylim())
            if self._set[i][0][0] == self._set[i][0][0] and now != self._set[i]:
                continue  # the user zoomed or panned this axis: leave it
            span = data_span(ax, artists)
            if span is None:
                continue
            if not _fits(now, span) or self._set[i][0][0] != self._set[i][0][0]:
                wanted = with_headroom(span, ax.get_yscale() == "log")
                ax.set_xlim(wanted[0])
                ax.set_ylim(wanted[1])
                self._set[i] = (ax.get_xlim(), ax.get_ylim())
                changed = True
        return changed

    def zoomed(self) -> list[bool]:
        """Per axis: whether the user zoomed or panned it (its limits are not the ones set here)."""
        visible = [ax for ax in self.fig.axes if ax.get_visible()]
        return [(ax.get_xlim(), ax.get_ylim()) != limits for ax, limits in zip(visible, self._set)]

    def png(self) -> bytes:
        import io

        out = io.BytesIO()
        with self._lock:
            self.fig.savefig(out, format="png", dpi=self.fig.dpi)
        return out.getvalue()


def with_options(opts: PlotOptions | None, **changes: Any) -> PlotOptions:
    return replace(opts or PlotOptions(panels=PANELS), **changes)


def _labels(artists: list[Any]) -> tuple[str, ...]:
    return tuple(str(a.get_label()) for a in artists if not str(a.get_label()).startswith("_"))


def data_span(ax: Any, artists: list[Any]) -> Limits | None:
    """The x and y range of the artists' data (finite values; positive ones on a log axis)."""
    xs, ys = [], []
    for artist in artists:
        if hasattr(artist, "get_xdata"):
            xs.append(np.asarray(artist.get_xdata(), float))
            ys.append(np.asarray(artist.get_ydata(), float))
        elif hasattr(artist, "get_datalim"):
            box = artist.get_datalim(ax.transData)
            xs.append(np.array([box.x0, box.x1]))
            ys.append(np.array([box.y0, box.y1]))
    x = np.concatenate(xs) if xs else np.array([])
    y = np.concatenate(ys) if ys else np.array([])
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if ax.get_yscale() == "log":
        y = y[y > 0]
    if not x.size or not y.size:
        return None
    return (float(x.min()), float(x.max())), (float(y.min()), float(y.max()))


def with_headroom(span: Limits, log_y: bool) -> Limits:
    """x: 25% past the data (fewer full draws while a run grows), 2% before it; y: 8% padding."""
    (x0, x1), (y0, y1) = span
    width = max(x1 - x0, 1.0)
    x_lo, x_hi = x0 - 0.02 * width, x0 + 1.25 * width
    if log_y:
        return (x_lo, x_hi), (y0 / 1.25, y1 * 1.25)
    pad = (y1 - y0) * 0.08 or max(abs(y1) * 0.05, 1e-6)
    return (x_lo, x_hi), (y0 - pad, y1 + pad)


def _fits(now: Limits, span: Limits) -> bool:
    (xl, xh), (yl, yh) = now
    (x0, x1), (y0, y1) = span
    inside = xl <= x0 and x1 <= xh and yl <= y0 and y1 <= yh
    too_loose = (yh - yl) > 1.8 * max(y1 - y0, 1e-12) * 1.16 and (y1 - y0) > 0
    return inside and not too_loose


def nearest_point(ax: Any, artists: list[Any], x_px: float, y_px: float, radius_px: float = 25.0) -> str:
    """"rank 3 · step 1,200 · 0.532": the labelled data point nearest the cursor ("" if none near)."""
    best: tuple[float, str] = (radius_px**2, "")
    for artist in artists:
        label = str(artist.get_gid() or artist.get_label())  # an outlier rank's line: named by its gid
        if label.startswith("_") or not hasattr(artist, "get_xdata"):
            continue
        x = np.asarray(artist.get_xdata(), float)
        y = np.asarray(artist.get_ydata(), float)
        if not x.size:
            continue
        points = ax.transData.transform(np.column_stack([x, y]))
        d2 = (points[:, 0] - x_px) ** 2 + (points[:, 1] - y_px) ** 2
        i = int(np.nanargmin(d2)) if np.isfinite(d2).any() else -1
        if i >= 0 and d2[i] < best[0]:
            best = (float(d2[i]), f"{label} · {ax.get_xlabel() or 'x'} {x[i]:,.6g} · {y[i]:.5g}")
    return best[1]
