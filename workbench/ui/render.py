"""A live matplotlib figure that is cheap to refresh: only new data is drawn, over a cached background.

The panels and their series come from ``workbench.results.panels`` and are drawn as the M4 artists of
``workbench.results.m4`` (full data held, reduced per pixel column when drawn).  A full draw (axes,
ticks, titles, legend: text layout is most of matplotlib's cost) happens when the panels, options or
legend change, or when new data leaves the axis limits (which get headroom while the run goes).  In
between, a refresh gives each artist its new full data; the buckets before each line's last one
cannot change, so they stay in a cached background and only the new part of each line is drawn and
blitted: the cost follows the new records, not the run's length.  On the ipympl canvas (the
dashboard's widget) a blit sends only the changed pixels, and zoom, pan and the toolbar work as usual:
x is shared by every panel (a zoom or pan moves them all), and a zoom or pan redraws from the full
data.  An axis the user zoomed keeps its limits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.results.m4 import M4Band
from workbench.results.panels import Panel, Spec, Views, choose_panels, not_drawn_on_log, panel_specs
from workbench.results.plots import (
    FOREGROUND,
    THEMES,
    PlotOptions,
    as_data,
    decorate,
    figure_legend,
    fit_legend_rows,
    fixed_margins,
    make_artist,
    panel_axes,
    theme_rc,
    update_artist,
    use_log,
)
from workbench.results.series import MetricData

if TYPE_CHECKING:
    import pandas as pd

Limits = tuple[tuple[float, float], tuple[float, float]]
_NUMBERS = iter(range(10**6, 10**9))  # figure numbers for ipympl managers (never registered with pyplot)
DEFAULT_WIDTH_PX = 960
TOOLBAR_PX = 240
"""ipympl's toolbar shows over the figure's top right while the pointer is on it (six buttons, 228 px
wide in JupyterLab 4 with ipympl 0.10, measured): the legend keeps left of it, or it hid the last entry."""
"""The figure's width until the browser has measured the output's (JupyterLab with the file browser
closed in a 1100 px window gives ~1000 px)."""
LIVE_HEADROOM = 0.15
"""While a run goes, x reaches this much past the data (fewer full draws as it grows)."""


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
    canvas.footer_visible = False  # the hover line under the figure says more (every series at x)
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
        def handle_refresh(self, event: Any) -> None:
            """A view (re)connected and cleared its picture: ask for a draw now (the whole picture
            follows), not only at the next change (a live view with nothing new stayed blank)."""
            super().handle_refresh(event)
            self.draw_idle()

        def get_diff_image(self) -> Any:
            """matplotlib's own (webagg_core: the changed pixels, or all of them), PNG-encoded at zlib
            level 1 instead of 6: half the encoding time of a refresh (a mostly empty diff compresses
            well either way)."""
            me: Any = self  # matplotlib's untyped state
            if not me._png_is_old:
                return None
            pixels = np.asarray(me.get_renderer().buffer_rgba())
            buff = pixels.view(np.uint32).squeeze(2)  # a pixel as one number: one comparison each
            if me._force_full or buff.shape != me._last_buff.shape or (pixels[:, :, 3] != 255).any():
                me.set_image_mode("full")
                output = buff
            else:
                me.set_image_mode("diff")
                output = np.where(buff != me._last_buff, buff, 0)
            me._last_buff = buff.copy()
            me._force_full = False
            me._png_is_old = False
            return _png(output.view(dtype=np.uint8).reshape((*output.shape, 4)))

        def send_binary(self, data: Any) -> None:
            super().send_binary(data)
            url: Any = getattr(self, "_data_url", None)
            if self.syncing_data_url and isinstance(url, str) and url and not url.startswith("data:"):
                self._data_url = "data:image/png;base64," + url

    return EmbeddedCanvas


def _png(rgba: np.ndarray) -> bytes:
    import io

    from PIL import Image

    with io.BytesIO() as out:
        Image.fromarray(rgba).save(out, format="png", compress_level=1)
        return out.getvalue()


@dataclass
class ViewRange:
    """What the panels show on x: the data's extent and the part of it in view."""

    axis: str
    shown: tuple[float, float] | None
    data: tuple[float, float] | None
    zoomed: bool
    not_drawn: tuple[tuple[str, int], ...] = ()
    """(panel title, values <= 0 its log-y axis leaves out), for the panels that leave some out."""


class LiveFigure:
    """The run's panels on one canvas; `update()` redraws what changed and says how."""

    def __init__(self, interactive: bool = False, width_px: int = DEFAULT_WIDTH_PX, dpi: int = 100):
        from matplotlib.figure import Figure

        self.interactive = interactive
        self.fig = Figure(figsize=(width_px / dpi, 4.0), dpi=dpi)
        self.canvas: Any = None
        self.on_canvas: Callable[[Any, Any], None] | None = None
        """Called with (new canvas, old canvas) when the figure changed size: the browser's view of
        an ipympl canvas does not follow a size set from the kernel, so a new canvas takes its place."""
        self._last: tuple[Any, ...] | None = None
        self.opts: PlotOptions | None = None
        self.views = Views()
        self.data = MetricData({})
        self.full_draws = 0
        self.line_draws = 0
        self.panels: list[Panel] = []
        self.axes: list[Any] = []
        self.artists: list[dict[str, Any]] = []
        self._layout: Any = None
        self.not_drawn: tuple[tuple[str, int], ...] = ()
        """Per log-y panel that leaves values out (<= 0): (its title, how many); said on the range line."""
        self._lock = threading.RLock()  # the poller thread and the kernel's draw (a zoom) share the renderer
        self._set: list[Limits] = []
        self._background: Any = None
        self._drawn: dict[int, int] = {}  # id(artist) -> points (vertices) kept in the background
        self._fitting = False
        self.live = True
        self.on_view: Callable[[], None] | None = None
        """Called whenever the x range shown changes (a zoom, a pan, a refit); a refit's after its draw."""
        self._updating = False
        self._view_pending = False
        self._new_canvas()
        self.fig.canvas.mpl_connect("draw_event", self._on_draw)  # the figure's registry: kept by a new canvas

    @property
    def columns(self) -> int:
        """Panels per row: as many as keep each ~300 px wide or more."""
        return max(1, min(3, int(self.fig.bbox.width // 300)))

    def _new_canvas(self) -> None:
        old = self.canvas
        self.canvas = make_canvas(self.fig, self.interactive)
        draw = self.canvas.draw
        self.canvas.draw = lambda *a, **k: self._locked(draw, *a, **k)
        self._background = None
        if old is not None and self.on_canvas is not None:
            self.on_canvas(self.canvas, old)

    def set_width(self, width_px: int) -> bool:
        """Fit the figure to `width_px` (the output's width, measured by the browser) and redraw;
        False when it is that wide already (within a few pixels)."""
        with self._lock:
            if width_px < 200 or abs(self.fig.bbox.width - width_px) < 8:
                return False
            self.fig.set_size_inches(width_px / self.fig.dpi, self.fig.get_figheight(), forward=False)
            self._layout = None  # laid out again, at the new size
            if self._last is not None:
                self.update(*self._last)
            return True

    def _locked(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(*args, **kwargs)

    # --- refresh ---------------------------------------------------------------------------------
    def update(self, frame: pd.DataFrame | MetricData | None, evals: pd.DataFrame | None, opts: PlotOptions,
               live: bool = True) -> str:
        """"full" (everything drawn) or "lines" (the new data only, over the background).  The range it
        shows is said (on_view) once the figure is drawn and sent: not over the previous figure."""
        with self._lock:
            self._updating = True
            try:
                return self._update(frame, evals, opts, live)
            finally:
                self._updating = False
                if self._view_pending:
                    self._view_pending = False
                    self._say_view()

    def _update(self, frame: pd.DataFrame | MetricData | None, evals: pd.DataFrame | None, opts: PlotOptions,
                live: bool) -> str:
        with theme_rc(opts.theme):
            self._last = (frame, evals, opts, live)
            self.data, self.live = as_data(frame, evals), live
            x = self.data.axis(opts.x)
            panels = choose_panels(self.data, opts.panels)
            specs = [panel_specs(p, self.data, x, opts, self.views, FOREGROUND[opts.theme]) for p in panels]
            layout = (opts, x, [(p, [s.key for s in ss], use_log(p, ss, opts)) for p, ss in zip(panels, specs)])
            self.not_drawn = tuple((p.title, n) for (p, _, log), ss in zip(layout[2], specs)
                                   if log and (n := not_drawn_on_log(ss)))
            if layout != self._layout:
                return self._rebuild(panels, specs, opts, x, layout)
            for artists, panel_specs_ in zip(self.artists, specs):
                for spec in panel_specs_:
                    update_artist(artists[spec.key], spec)
            if self._fit_limits() or self._background is None:
                self._full_draw()
                return "full"
            if not self._draw_new():
                self._full_draw()
                return "full"
            self.line_draws += 1
            return "lines"

    def _rebuild(self, panels: list[Panel], specs: list[list[Spec]], opts: PlotOptions, x: str,
                 layout: Any) -> str:
        if opts != self.opts:
            self.views = Views()  # new smoothing or ranks: nothing cached applies
        self.opts, self.panels, self._layout = opts, panels, layout
        self.fig.clear()
        self.fig.set_facecolor(THEMES[opts.theme]["figure.facecolor"])
        ncols = max(1, min(self.columns, len(panels)))
        nrows = max(1, -(-len(panels) // ncols))
        self._resize(nrows)
        self.fig.set_layout_engine("none")  # fixed margins: a constrained layout measures every label ~20 times
        self.fig.subplots_adjust(**fixed_margins(self.fig, nrows, ncols))
        self.axes = panel_axes(self.fig, len(panels), ncols)
        self.artists = []
        for ax, panel, panel_specs_ in zip(self.axes, panels, specs):
            self.artists.append({s.key: make_artist(ax, s) for s in panel_specs_})
            decorate(ax, panel, panel_specs_, opts, x)
        clear = TOOLBAR_PX if self.interactive else 0.0
        fit_legend_rows(self.fig, figure_legend(self.fig, self.axes, clear), clear)
        if not panels:
            self.fig.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", fontsize=13,
                          color=FOREGROUND[opts.theme])
        if self.axes:
            self.axes[0].callbacks.connect("xlim_changed", self._view_changed)
        self._set = []
        self._fit_limits()
        self._full_draw()
        return "full"

    def _resize(self, nrows: int) -> None:
        height = 0.55 + 2.75 * nrows
        if abs(self.fig.get_figheight() - height) > 1e-6:
            self.fig.set_size_inches(self.fig.get_figwidth(), height, forward=False)
        if self.interactive and tuple(self.canvas._size) != tuple(self.fig.bbox.size):
            self._new_canvas()

    def _full_draw(self) -> None:
        for artist in self._all_artists():
            artist.set_animated(True)  # left out of the background, drawn over it
        self.canvas.draw()  # _on_draw caches the background and draws the data
        self.full_draws += 1

    def _all_artists(self) -> list[Any]:
        return [a for artists in self.artists for a in artists.values()]

    def _on_draw(self, _event: Any) -> None:
        """After any full draw (ours, or the toolbar's zoom or pan): the axes alone are the
        background; the data's final part is drawn into it and cached, then the rest over it."""
        with self._lock:
            self._background = None
            self._drawn = {}
            self._draw_new(full=True)

    def _draw_new(self, full: bool = False) -> bool:
        """Draw what is new since the cached background (everything after a full draw): the final
        points into the background, which is then cached again, the rest over it; False when an
        artist's drawn points changed (a full draw is needed)."""
        renderer = self.canvas.get_renderer()
        parts = []
        for artist in self._all_artists():
            kept = artist.reduce() if hasattr(artist, "reduce") else True
            if not kept and not full:
                return False
            parts.append((artist, self._drawn.get(id(artist), 0), getattr(artist, "final", None)))
        if self._background is not None:
            self.canvas.restore_region(self._background)
        _draw_parts(renderer, [(a, drawn, final) for a, drawn, final in parts if final is not None and final > drawn])
        for artist, drawn, final in parts:
            self._drawn[id(artist)] = max(drawn, final or 0)
        self._background = self.canvas.copy_from_bbox(self.fig.bbox)
        _draw_parts(renderer, [(a, final, None) for a, _, final in parts if final is not None])
        for artist, _, final in parts:
            if final is None and artist.get_visible():  # evals, names: few points, drawn whole each time
                artist.axes.draw_artist(artist)
        if not full:
            self.canvas.blit(self.fig.bbox)
        return True

    # --- limits ----------------------------------------------------------------------------------
    def _view_changed(self, _ax: Any) -> None:
        if not self._fitting:
            self._say_view()

    def _say_view(self) -> None:
        if self._updating:
            self._view_pending = True  # said after the update's draw
        elif self.on_view is not None:
            self.on_view()

    def _fit_limits(self) -> bool:
        """Give each axis the user has not zoomed limits that hold its data; whether any changed."""
        self._fitting = True
        try:
            changed = self._refit()
        finally:
            self._fitting = False
        self._say_view()
        return changed

    def _refit(self) -> bool:
        if not self.axes:
            return False
        if len(self._set) != len(self.axes):
            self._set = [((np.nan, np.nan), (np.nan, np.nan))] * len(self.axes)
        spans = [from_zero(data_span(ax, artists.values()), panel.from_zero)
                 for ax, artists, panel in zip(self.axes, self.artists, self.panels)]
        found = [s for s in spans if s is not None]
        if not found:
            return False
        x_span = (min(s[0][0] for s in found), max(s[0][1] for s in found))
        changed = False
        first = self._set[0][0][0] != self._set[0][0][0]  # laid out just now: limits from the data
        x_now = self.axes[0].get_xlim()
        if first or (not self._user_moved(x_now, self._set[0][0], x_span) and not _x_fits(x_now, x_span, self.live)):
            self.axes[0].set_xlim(*x_limits(x_span, self.live))
            changed = True
        if first or changed or x_now == self._set[0][0]:
            x_set = self.axes[0].get_xlim()
        else:
            x_set = self._set[0][0]  # the user's zoom stays a zoom
        for i, (ax, span) in enumerate(zip(self.axes, spans)):
            y_now = ax.get_ylim()
            log_y = ax.get_yscale() == "log"
            y_set = self._set[i][1]
            if span is not None and (first or (not self._user_moved(y_now, y_set, span[1])
                                               and not _y_fits(y_now, span[1], log_y))):
                ax.set_ylim(*y_limits(span[1], log_y))
                changed = True
                y_set = ax.get_ylim()
            elif first or y_now == y_set:
                y_set = y_now
            self._set[i] = (x_set, y_set)
        return changed

    @staticmethod
    def _user_moved(now: tuple[float, float], set_: tuple[float, float], span: tuple[float, float]) -> bool:
        """The user zoomed or panned this axis: its limits are not the last ones set here, and they
        cut the data (zooming out past the data counts as showing all of it, which then follows it)."""
        if set_[0] != set_[0] or now == set_:
            return False
        return now[0] > span[0] or now[1] < span[1]

    def zoomed(self) -> list[bool]:
        """Per panel: whether the user zoomed or panned it (its limits are not the ones set here)."""
        return [(ax.get_xlim(), ax.get_ylim()) != limits for ax, limits in zip(self.axes, self._set)]

    def view_range(self) -> ViewRange:
        """The x range of the data and the part of it shown (data extent, never axis limits)."""
        axis = self._layout[1] if self._layout else "step"
        extent = self.data.extent(axis)
        if not self.axes or extent is None:
            return ViewRange(axis, None, extent, False)
        low, high = sorted(self.axes[0].get_xlim())
        shown = (max(low, extent[0]), min(high, extent[1]))
        zoomed = low > extent[0] or high < extent[1]
        return ViewRange(axis, shown if shown[0] <= shown[1] else None, extent, zoomed, self.not_drawn)

    def png(self) -> bytes:
        import io

        out = io.BytesIO()
        with self._lock:
            self.fig.savefig(out, format="png", dpi=self.fig.dpi)
        return out.getvalue()

    def last_x(self) -> dict[str, float]:
        """Per drawn series ("panel/label", e.g. "loss/rank 0"): the last x of its full data (what a
        test checks against the progress line)."""
        found = {}
        for panel, artists in zip(self.panels, self.artists):
            for artist in artists.values():
                full = getattr(artist, "full_x", None)
                if full is not None and len(full):
                    found[f"{panel.key}/{artist.get_gid() or artist.get_label()}"] = float(full[-1])
        return found


def _draw_parts(renderer: Any, parts: list[tuple[Any, int, int | None]]) -> None:
    """Draw parts of M4 artists (artist, start, stop), in their order: per panel one LineCollection
    for the lines and the bands' polygons, one call each (a Line2D draw costs ~1 ms of set-up)."""
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.colors import to_rgba

    by_axes: dict[Any, tuple[list[Any], list[Any]]] = {}
    for artist, start, stop in parts:
        if not artist.get_visible() or artist.axes is None:
            continue
        lines, bands = by_axes.setdefault(artist.axes, ([], []))
        (bands if isinstance(artist, M4Band) else lines).append((artist, artist.part(start, stop)))
    for ax, (lines, bands) in by_axes.items():
        strokes = [(xy, to_rgba(a.get_color(), a.get_alpha()), a.get_linewidth(), a.get_linestyle()) for a, xy in lines]
        for band, verts in bands:
            poly = PolyCollection([verts], facecolors=band.get_facecolor(), edgecolors="none", linewidths=0)
            _draw_in(poly, ax, renderer)
            width = float(np.max(band.get_linewidth()))
            if width > 0:  # its outline as two lines: a part's closing sides would stroke a seam at each join
                half = len(verts) // 2
                colour = tuple(band.get_edgecolor()[0])
                strokes = [(verts[:half], colour, width, "solid"), (verts[half:], colour, width, "solid"), *strokes]
        if strokes:
            coll = LineCollection([xy for xy, _, _, _ in strokes], colors=[c for _, c, _, _ in strokes],
                                  linewidths=[w for _, _, w, _ in strokes],
                                  linestyles=[ls for _, _, _, ls in strokes], capstyle="butt", joinstyle="round")
            _draw_in(coll, ax, renderer)


def _draw_in(collection: Any, ax: Any, renderer: Any) -> None:
    collection.set_transform(ax.transData)
    collection.set_figure(ax.figure)
    collection.axes = ax
    collection.set_clip_box(ax.bbox)
    collection.draw(renderer)


def data_span(ax: Any, artists: Any) -> Limits | None:
    """The x and y range of the artists' full data (finite values; positive ones on a log axis)."""
    log_y = ax.get_yscale() == "log"
    boxes = []
    for artist in artists:
        bounds = getattr(artist, "bounds", None)
        if bounds is None and hasattr(artist, "get_xdata") and not hasattr(artist, "full_x"):
            bounds = _bounds_of(np.asarray(artist.get_xdata(), float), np.asarray(artist.get_ydata(), float))
        if bounds is not None:
            boxes.append((bounds[0], bounds[1], bounds[4] if log_y else bounds[2], bounds[3]))
    boxes = [b for b in boxes if all(np.isfinite(b))]
    if not boxes:
        return None
    return ((min(b[0] for b in boxes), max(b[1] for b in boxes)), (min(b[2] for b in boxes), max(b[3] for b in boxes)))


def _bounds_of(x: np.ndarray, y: np.ndarray) -> tuple[float, ...] | None:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not len(x):
        return None
    positive = y[y > 0]
    return (float(x.min()), float(x.max()), float(y.min()), float(y.max()),
            float(positive.min()) if len(positive) else float("nan"))


def x_limits(span: tuple[float, float], live: bool) -> tuple[float, float]:
    """x: 2% before the data; past it LIVE_HEADROOM while the run goes, else 2%."""
    x0, x1 = span
    width = max(x1 - x0, 1.0)
    return x0 - 0.02 * width, x1 + (LIVE_HEADROOM if live else 0.02) * width


def from_zero(span: Any, wanted: bool) -> Any:
    """A panel of amounts (Panel.from_zero): its y span reaches down to 0."""
    if not wanted or span is None:
        return span
    (x0, x1), (y0, y1) = span
    return (x0, x1), (min(0.0, y0), y1)


def y_limits(span: tuple[float, float], log_y: bool) -> tuple[float, float]:
    y0, y1 = span
    if log_y:
        return y0 / 1.25, y1 * 1.25
    pad = (y1 - y0) * 0.06
    if pad <= abs(y1) * 1e-6:  # flat (up to rounding): a band around it
        pad = max(abs(y1) * 0.05, 1e-9)
    return y0 - pad, y1 + pad


def _x_fits(now: tuple[float, float], span: tuple[float, float], live: bool) -> bool:
    low, high = now
    width = max(span[1] - span[0], 1.0)
    inside = low <= span[0] and span[1] <= high
    loose = (high - span[1]) > (LIVE_HEADROOM * 1.5 if live else 0.05) * width
    return inside and not loose


def _y_fits(now: tuple[float, float], span: tuple[float, float], log_y: bool) -> bool:
    """The data is inside, and takes a fair part of the height (else refit: it shrank a lot)."""
    low, high = now
    inside = low <= span[0] and span[1] <= high
    want_low, want_high = y_limits(span, log_y)
    if log_y:
        return inside and np.log(high / max(low, 1e-300)) < 1.6 * np.log(want_high / max(want_low, 1e-300))
    return inside and (high - low) < 1.6 * (want_high - want_low)


def values_at(ax: Any, artists: Any, x: float) -> tuple[float | None, list[tuple[str, str]]]:
    """Every labelled series of a panel at x (the point at or before it; a band: its min-max): the
    x found and (label, value) pairs, a smoothed series' raw value beside its own."""
    found: list[tuple[str, str]] = []
    at: float | None = None
    for artist in artists:
        label = str(artist.get_gid() or artist.get_label())
        if label.startswith("_"):  # a raw series (its value is given beside its smoothed one), a note
            continue
        if hasattr(artist, "full"):  # the band
            bx, low, high = artist.full
            i = _index_at(bx, x)
            if i is not None:
                found.append((label.replace("min-max of ", "min–max, "), f"{low[i]:.4g} – {high[i]:.4g}"))
            continue
        if not hasattr(artist, "get_xdata"):
            continue
        xs: Any = getattr(artist, "full_x", None)
        ys: Any = getattr(artist, "full_y", None)
        if xs is None:
            xs, ys = np.asarray(artist.get_xdata(), float), np.asarray(artist.get_ydata(), float)
        i = _index_at(xs, x)
        if i is None:
            continue
        at = float(xs[i]) if at is None else at
        text = f"{ys[i]:.4g}"
        raw: Any = getattr(artist, "full_raw", None)
        if raw is not None and np.isfinite(raw[i]):
            text += f" (raw {raw[i]:.4g})"
        found.append((label, text))
    return at, found


def _index_at(xs: np.ndarray, x: float) -> int | None:
    """The last point at or before x (the first one when x is before them all); None if no points."""
    if not len(xs):
        return None
    return int(min(max(np.searchsorted(xs, x, "right") - 1, 0), len(xs) - 1))
