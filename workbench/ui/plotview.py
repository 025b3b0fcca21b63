"""MetricsPlot: the run's panels as an interactive figure (ipympl: zoom and pan linked across panels,
every series' value under the cursor) with controls for the x axis, log-y, smoothing, the ranks shown
and the theme; the dashboard embeds one, ``run.plot(interactive=True)`` returns one.  The choices
(all but the theme, which follows JupyterLab's) are remembered for the next plot
(workbench.ui.plotsettings)."""

from __future__ import annotations

import dataclasses
import html
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.results.metricview import X_AXES
from workbench.results.plots import PlotOptions, hidden_text, options
from workbench.results.series import MetricData
from workbench.ui import plotsettings
from workbench.ui.render import LiveFigure, ViewRange, values_at

if TYPE_CHECKING:
    import pandas as pd

    from workbench.launch.run import Run

X_CHOICES = [(label, column) for column, label in X_AXES.items()]
Y_CHOICES = [("y: auto (log past 10x)", "auto"), ("y: log", "log"), ("y: linear", "linear")]
LOG_Y = {"auto": None, "log": True, "linear": False}
HOVER_SERIES = 12
"""Series named in the hover line at most (a band counts one)."""
HOVER_BLANK = "<span class='wb-hover' style='font-size:90%'>&nbsp;</span>"
"""The hover line until the pointer is over a panel again: values read before a zoom, a reset, a rank
filter or a new canvas are not the ones under the pointer now."""


def parse_ranks(text: str) -> tuple[int, ...] | None:
    """"all" or "" -> None (every rank); "0-3,7" -> (0, 1, 2, 3, 7); anything else is a ValueError
    naming the fix."""
    text = text.strip().lower()
    if text in ("", "all"):
        return None
    ranks: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"ranks: {part!r} is not a rank or a range; write e.g. all, 0-3,7")
        ranks.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(ranks))


def lab_theme() -> str:
    """"dark" when the user's JupyterLab theme is a dark one (its saved setting, as the kernel can read
    it from the settings folder the server uses), else "light"; the toggle changes it either way."""
    import json
    import os
    import re
    from pathlib import Path

    folder = os.environ.get("JUPYTERLAB_SETTINGS_DIR") or str(Path.home() / ".jupyter" / "lab" / "user-settings")
    path = Path(folder) / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    from workbench.runfolder.private import read_bounded

    try:  # a regular file, bounded (a FIFO there is not waited on); nested too deeply is damaged
        text = re.sub(r"^\s*//.*$", "", read_bounded(path, 1 << 20).decode(), flags=re.M)  # it may carry // comments
        theme = str(json.loads(text).get("theme", ""))
    except (OSError, ValueError, AttributeError, RecursionError):
        return "light"
    return "dark" if "dark" in theme.lower() else "light"


def initial_options(given: dict[str, Any], remember: bool, run: str | None = None) -> tuple[PlotOptions, str, str]:
    """The options to start with: those given, else the ones remembered (the run's own, then every
    plot's), else the defaults; the ranks text for the control; and where the smoothing came from:
    "given", "run" (chosen on this run), "remembered" (chosen on another) or "default"."""
    own = plotsettings.load_run(run) if remember and run is not None else {}
    saved = {**plotsettings.load(), **own} if remember else {}
    smooth_from = ("given" if "smooth" in given else "run" if "smooth" in own else
                   "remembered" if "smooth" in saved else "default")
    ranks_text = saved.pop("ranks", "all")
    if "ranks" in given:
        ranks = given.pop("ranks")
        ranks_text = "all" if ranks is None else ",".join(str(r) for r in ranks)
    try:
        ranks_value = parse_ranks(ranks_text)
    except ValueError:
        ranks_text, ranks_value = "all", None
    given.setdefault("theme", lab_theme())
    return options(**{**saved, **given, "ranks": ranks_value}), ranks_text, smooth_from


def smoothing_window(weight: float) -> float:
    """The points an EMA of this weight averages over (1 / (1 - weight)): 0.6 -> 2.5, 0.97 -> 33."""
    return 1.0 / max(1e-9, 1.0 - weight)


def points_of(data: MetricData | pd.DataFrame | None) -> int:
    """The most points a rank has logged."""
    if data is None:
        return 0
    if not isinstance(data, MetricData):  # a DataFrame
        return int(data.groupby("rank").size().max()) if len(data) and "rank" in data else len(data)
    return max((len(cols.get("step", ())) for cols in data.ranks.values()), default=0)


class MetricsPlot:
    """Interactive panels over a Run (or a fixed frame); `refresh()` reads the run and redraws."""

    def __init__(self, run: Run | None = None, frame: pd.DataFrame | None = None,
                 evals: pd.DataFrame | None = None, remember: bool = True, key: str | None = None, **given: Any):
        """`key`: the run folder the choices belong to (the rank filter, a smoothing chosen here); a
        Run's own folder by default."""
        self.run = run
        self.remember = remember
        self.key = key if key is not None else (str(run.folder) if run is not None else None)
        self.data: MetricData | pd.DataFrame | None = frame
        self.evals = evals
        self.live_run = True
        self.expected_points = 0
        """The points the run will log (its total steps, when known): a smoothing is judged against it."""
        self.opts, ranks_text, self.smooth_from = initial_options(dict(given), remember, self.key)
        self._holding = False
        self._short_run = ""
        """Said beside the figure when a remembered smoothing gave way to the default (_fit_smoothing)."""
        self._limits: tuple[Any, ...] = ()
        """The x limits the hover line was read under (_on_view)."""
        self.live = LiveFigure(interactive=True)
        self.live.on_view = self._on_view
        self.live.on_canvas = self._on_canvas
        self._lock = threading.Lock()
        self._build_widgets(ranks_text)
        self.live.canvas.mpl_connect("motion_notify_event", self._on_hover)
        if run is not None:
            self.refresh()
        else:
            self.redraw()  # an image before the widget is shown: ipympl's view paints it first (none breaks it)

    def _build_widgets(self, ranks_text: str) -> None:
        o = self.opts
        y = "auto" if o.log_y is None else ("log" if o.log_y else "linear")
        self.x = w.Dropdown(options=X_CHOICES, value=o.x, description="x axis", layout=w.Layout(width="210px"))
        self.log_y = w.Dropdown(options=Y_CHOICES, value=y, layout=w.Layout(width="190px"),
                                tooltip="log-y on the loss and validation panels")
        self.smooth = w.FloatSlider(value=o.smooth, min=0.0, max=0.999, step=0.001, description="smoothing",
                                    readout_format=".3f",
                                    tooltip="EMA weight per logged point, as TensorBoard's; raw behind",
                                    layout=w.Layout(width="300px"))
        self.ranks = w.Text(value=ranks_text, description="ranks", placeholder="all, or e.g. 0-3,7",
                            continuous_update=False, layout=w.Layout(width="200px"))
        self.theme = w.ToggleButtons(options=["light", "dark"], value=o.theme, style={"button_width": "56px"},
                                     tooltip="figure colours for JupyterLab's light or dark theme")
        self.note = w.HTML()
        self.shown = w.HTML()
        """Beside the figure: which ranks it leaves out, and a remembered smoothing not used here."""
        self.hover = w.HTML(HOVER_BLANK)
        self.view = w.HTML()
        for control in (self.x, self.log_y, self.smooth, self.ranks, self.theme):
            control.observe(lambda _: self._on_controls(), names="value")
        controls = w.HBox([self.x, self.log_y, self.smooth, self.ranks, self.theme],
                          layout=w.Layout(flex_flow="row wrap", align_items="center"))
        self.width = w.Text(continuous_update=True, layout=w.Layout(display="none"))
        self.width.add_class("wb-width-sink")
        self.width.observe(self._on_width, names="value")
        self.figure_box = w.Box([self.live.canvas])
        self.widget = w.VBox([controls, self.note, self.shown, self.view, self.figure_box, self.hover, self.width,
                              width_probe()], layout=w.Layout(width="100%"))
        self.widget.add_class("wb-plot")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # --- data ------------------------------------------------------------------------------------
    def refresh(self) -> str:
        """Read the run (what was appended since the last read) and redraw; "full" or "lines"."""
        if self.run is not None:
            with self.run.reading:  # the status and the curves of one poll (workbench.ui.state.read_state)
                status, _ = self.run.live_status()  # one poll (SLURM not answering is no error here)
                self.data = MetricData.from_run(self.run, self.run.evals())
            self.live_run = not status.done
        return self.redraw()

    def show(self, data: MetricData | pd.DataFrame, evals: pd.DataFrame | None = None, live: bool = True,
             total_steps: int | None = None) -> str:
        """Draw `data` (the dashboard hands over the snapshot it read, and the run's total steps)."""
        self.data, self.evals, self.live_run = data, evals, live
        self.expected_points = max(self.expected_points, total_steps or 0)
        return self.redraw()

    def redraw(self) -> str:
        self._fit_smoothing()
        with self._lock:
            drawn = self.live.update(self.data, self.evals, self.opts, live=self.live_run)
        self.shown.value = shown_html(self.opts, self.data, self._short_run)
        return drawn

    def _fit_smoothing(self) -> None:
        """A smoothing remembered from another run that averages over more than a quarter of this run's
        points (0.97 over a 23-step run: a flat line) gives way to the default here, and says so."""
        points = max(self.expected_points, points_of(self.data))
        if self.smooth_from != "remembered" or not points or smoothing_window(self.opts.smooth) <= points / 4:
            return
        default = PlotOptions().smooth
        self._short_run = (f"smoothing {self.opts.smooth:g} (remembered) averages over more points than this run "
                           f"has ({points}): {default:g} here")
        self.smooth_from = "default"
        self.opts = dataclasses.replace(self.opts, smooth=default)
        self._holding = True
        try:
            self.smooth.value = default
        finally:
            self._holding = False

    def _on_width(self, change: Any) -> None:
        """The browser measured the output's width: the figure fills it."""
        try:
            width = int(float(change["new"]))
        except (TypeError, ValueError):
            return
        with self._lock:
            self.live.set_width(width)

    def _on_canvas(self, new: Any, old: Any) -> None:
        """The figure changed size: its new canvas takes the old one's place, in a new box (ipympl's
        view does not leave the page when it is removed; the box's view takes it along)."""
        self.hover.value = HOVER_BLANK
        box, self.figure_box = self.figure_box, w.Box([new])
        self.widget.children = tuple(self.figure_box if child is box else child for child in self.widget.children)
        box.close()
        old.close()

    def _on_controls(self) -> None:
        if self._holding:
            return
        try:
            ranks = parse_ranks(self.ranks.value)
        except ValueError as exc:
            self.note.value = f"<span style='color:var(--jp-ui-font-color1,#222)'>✘ {html.escape(str(exc))}</span>"
            return
        self.note.value = ""
        self.hover.value = HOVER_BLANK  # other series now: what it read is not on the figure
        if float(self.smooth.value) != self.opts.smooth:
            self.smooth_from, self._short_run = "run", ""
        self.opts = PlotOptions(x=self.x.value, log_y=LOG_Y[self.log_y.value], smooth=float(self.smooth.value),
                                ranks=ranks, theme=self.theme.value, panels=self.opts.panels)
        if self.remember:
            plotsettings.save({"x": self.opts.x, "log_y": self.opts.log_y, "smooth": self.opts.smooth,
                               "ranks": self.ranks.value.strip() or "all"}, run=self.key)
        self.redraw()

    def _on_view(self) -> None:
        """Say which part of the data the panels show (x is linked across them)."""
        found = self.live.view_range()
        self.view.value = range_html(found)
        limits = tuple(self.live.axes[0].get_xlim()) if self.live.axes else ()  # x is linked across panels
        if limits != self._limits:  # a zoom, a pan, a reset: the pointer is over other values now
            self._limits = limits
            self.hover.value = HOVER_BLANK

    def _on_hover(self, event: Any) -> None:
        """Every series of the panel under the cursor, at the cursor's x."""
        if event.inaxes is None or event.inaxes not in self.live.axes or event.xdata is None:
            return
        i = self.live.axes.index(event.inaxes)
        at, found = values_at(event.inaxes, self.live.artists[i].values(), float(event.xdata))
        if at is None and not found:
            return
        label = X_AXES.get(self.live.view_range().axis, "x")
        head = f"{label} {number(at if at is not None else float(event.xdata))}"
        parts = [f"{html.escape(name)} <b>{html.escape(value)}</b>" for name, value in found[:HOVER_SERIES]]
        more = f" · … {len(found) - HOVER_SERIES} more" if len(found) > HOVER_SERIES else ""
        self.hover.value = (f"<span class='wb-hover' style='font-size:90%'>{html.escape(self.live.panels[i].title)}"
                            f" at {html.escape(head)}: " + " · ".join(parts) + more + "</span>")


WIDTH_PROBE = """
(function () {
  // Measure the plot's box (as wide as the output) and send its width to the kernel through the
  // hidden text box beside it; again whenever it changes (a window or side panel resized).
  const script = document.currentScript;
  function attach(tries) {
    const roots = [...document.querySelectorAll(".wb-plot")].filter(r => !r.dataset.wbWidth);
    const ready = roots.filter(r => r.querySelector(".wb-width-sink input"));
    for (const root of ready) {
      root.dataset.wbWidth = "1";
      const input = root.querySelector(".wb-width-sink input");
      let sent = 0, timer = 0;
      const send = () => {
        const width = Math.floor(root.getBoundingClientRect().width) - 4;
        if (width > 200 && Math.abs(width - sent) > 8) {
          sent = width;
          input.value = String(width);
          input.dispatchEvent(new Event("input", {bubbles: true}));
        }
      };
      new ResizeObserver(() => { clearTimeout(timer); timer = setTimeout(send, 300); }).observe(root);
      send();
    }
    if ((!ready.length || ready.length < roots.length) && tries < 300) setTimeout(() => attach(tries + 1), 100);
  }
  attach(0);
})();
"""


def width_probe() -> Any:
    """WIDTH_PROBE in the page; where it does not run (an untrusted notebook, another frontend) the
    default width stays."""
    return page_script(WIDTH_PROBE)


def page_script(source: str) -> Any:
    """A hidden Output holding `source` as JavaScript: JupyterLab runs it (outputs made in the session
    are trusted)."""
    probe = w.Output(layout=w.Layout(display="none"))
    probe.outputs = ({"output_type": "display_data", "metadata": {},
                      "data": {"application/javascript": source, "text/plain": ""}},)
    return probe


def number(value: float) -> str:
    return f"{value:,.0f}" if abs(value - round(value)) < 1e-9 or abs(value) >= 1000 else f"{value:,.4g}"


def shown_html(opts: PlotOptions, data: MetricData | pd.DataFrame | None, short_run: str = "") -> str:
    """What the figure leaves out, said beside it: ranks the rank filter hides; a remembered smoothing
    not used (short_run)."""
    parts = []
    if opts.ranks is not None and data is not None:
        have = sorted(data.ranks) if isinstance(data, MetricData) else \
            sorted(int(r) for r in data["rank"].unique()) if len(data) and "rank" in data else []
        hidden = [r for r in have if r not in opts.ranks]
        if hidden:
            shown = [r for r in have if r in opts.ranks]
            parts.append(f"showing rank{'s' if len(shown) != 1 else ''} {', '.join(map(str, shown)) or 'none'} of "
                         f"{len(have)} (the ranks box; 'all' shows every rank)")
    if short_run:
        parts.append(short_run)
    if not parts:
        return ""
    return (f"<span class='wb-shown' style='font-size:90%;color:var(--jp-ui-font-color1,#222);border-left:3px solid "
            f"#f57c00;padding:0 6px'>{html.escape('; '.join(parts))}</span>")


def range_html(found: ViewRange) -> str:
    """The range line: the data each panel shows (its extent, not the axis limits)."""
    label = X_AXES.get(found.axis, found.axis)
    if found.data is None:
        text = "no data yet"
    elif found.shown is None:
        text = f"nothing in view: the data spans {label} {number(found.data[0])} – {number(found.data[1])}"
    elif found.zoomed:
        text = (f"{label} {number(found.shown[0])} – {number(found.shown[1])} of {number(found.data[0])} – "
                f"{number(found.data[1])} (zoomed; x is linked across panels; the toolbar's home button resets)")
    else:
        text = f"{label} {number(found.data[0])} – {number(found.data[1])}: all data (x is linked across panels)"
    if found.not_drawn:
        text += "; " + "; ".join(f"{title}: {hidden_text(count)}" for title, count in found.not_drawn)
    return (f"<span class='wb-view' data-zoomed='{str(found.zoomed).lower()}' style='font-size:90%'>"
            f"{html.escape(text)}</span>")
