"""MetricsPlot: the run's panels as an interactive figure (ipympl: zoom, pan, hover values) with
controls for the x axis, log-y, smoothing, the ranks shown and the theme; the dashboard embeds one,
``run.plot(interactive=True)`` returns one."""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.results.metricview import X_AXES
from workbench.results.plots import PANELS, PlotOptions
from workbench.ui.render import LiveFigure, nearest_point

if TYPE_CHECKING:
    import pandas as pd

    from workbench.launch.run import Run

X_CHOICES = [(label, column) for column, label in X_AXES.items()]


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
    try:
        text = re.sub(r"^\s*//.*$", "", path.read_text(), flags=re.M)  # the file may carry // comments
        theme = str(json.loads(text).get("theme", ""))
    except (OSError, ValueError, AttributeError):
        return "light"
    return "dark" if "dark" in theme.lower() else "light"


class MetricsPlot:
    """Interactive panels over a Run (or a fixed frame); `refresh()` reads the run and redraws."""

    def __init__(self, run: Run | None = None, frame: pd.DataFrame | None = None,
                 evals: pd.DataFrame | None = None, max_points: int = 2000, **options: Any):
        self.run = run
        self.frame, self.evals = frame, evals
        options.setdefault("theme", lab_theme())
        self.opts = PlotOptions(max_points=max_points, panels=tuple(options.pop("panels", PANELS)),
                                **{k: v for k, v in options.items() if k in PlotOptions.__dataclass_fields__})
        self.live = LiveFigure(interactive=True)
        self.live.on_view = self._on_view
        self._lock = threading.Lock()
        self._build_widgets()
        self.live.canvas.mpl_connect("motion_notify_event", self._on_hover)
        if run is not None:
            self.refresh()
        else:
            self.redraw()  # an image before the widget is shown: ipympl's view paints it first (none breaks it)

    def _build_widgets(self) -> None:
        o = self.opts
        self.x = w.Dropdown(options=X_CHOICES, value=o.x, description="x axis", layout=w.Layout(width="220px"))
        self.log_y = w.Checkbox(value=o.log_y, description="log y (loss, val)", indent=False,
                                layout=w.Layout(width="150px"))
        self.smooth = w.FloatSlider(value=o.smooth, min=0.0, max=0.99, step=0.01, description="smoothing",
                                    tooltip="EMA weight (raw series faint behind)", layout=w.Layout(width="300px"))
        self.ranks = w.Text(value="all", description="ranks", placeholder="all, or e.g. 0-3,7",
                            continuous_update=False, layout=w.Layout(width="220px"))
        self.theme = w.ToggleButtons(options=["light", "dark"], value=o.theme, style={"button_width": "56px"},
                                     tooltip="figure colours for JupyterLab's light or dark theme")
        self.note = w.HTML()
        self.hover = w.HTML("<span class='wb-hover' style='font-size:90%'>&nbsp;</span>")
        self.view = w.HTML()
        for control in (self.x, self.log_y, self.smooth, self.ranks, self.theme):
            control.observe(lambda _: self._on_controls(), names="value")
        controls = w.HBox([self.x, self.log_y, self.smooth, self.ranks, self.theme],
                          layout=w.Layout(flex_flow="row wrap", align_items="center"))
        self.widget = w.VBox([controls, self.note, self.live.canvas, w.HBox([self.view, self.hover])])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # --- data ------------------------------------------------------------------------------------
    def refresh(self) -> str:
        """Read the run (incrementally) and redraw; returns "full" or "lines"."""
        if self.run is not None:
            self.frame = self.run.metrics(self.opts.max_points)
            self.evals = self.run.evals()
        return self.redraw()

    def show(self, frame: pd.DataFrame, evals: pd.DataFrame | None) -> str:
        """Draw `frame` and `evals` (the dashboard hands over what it read)."""
        self.frame, self.evals = frame, evals
        return self.redraw()

    def redraw(self) -> str:
        import pandas as pd

        with self._lock:
            frame = self.frame if self.frame is not None else pd.DataFrame()
            return self.live.update(frame, self.evals, self.opts)

    def _on_controls(self) -> None:
        try:
            ranks = parse_ranks(self.ranks.value)
        except ValueError as exc:
            self.note.value = f"<span style='color:var(--jp-ui-font-color1,#222)'>✘ {html.escape(str(exc))}</span>"
            return
        self.note.value = ""
        self.opts = PlotOptions(x=self.x.value, log_y=self.log_y.value, smooth=float(self.smooth.value),
                                ranks=ranks, theme=self.theme.value, max_points=self.opts.max_points,
                                panels=self.opts.panels)
        self.redraw()

    def _on_view(self, ax: Any) -> None:
        """Say which x range the panels show, and whether that is the user's zoom."""
        low, high = ax.get_xlim()
        zoomed = any(self.live.zoomed()[:1])
        how = "zoomed; the toolbar's home button resets" if zoomed else "all of it"
        self.view.value = (f"<span class='wb-view' data-zoomed='{str(zoomed).lower()}' style='font-size:90%;"
                           f"margin-right:16px'>{html.escape(ax.get_xlabel() or 'x')} "
                           f"{low:,.0f} – {high:,.0f} ({how})</span>")

    def _on_hover(self, event: Any) -> None:
        """The nearest labelled point under the cursor: rank, x and value."""
        if event.inaxes is None:
            return
        axes = [ax for ax in self.live.fig.axes if ax.get_visible()]
        if event.inaxes not in axes:
            return
        artists = self.live._data[axes.index(event.inaxes)]
        text = nearest_point(event.inaxes, artists, event.x, event.y)
        if text:
            self.hover.value = f"<span class='wb-hover' style='font-size:90%'>{html.escape(text)}</span>"
