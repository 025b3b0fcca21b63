"""RunsView: the run history as a widget - every run folder under a root, with open (its dashboard),
compare (workbench.compare of the selected runs), cancel and resume.

    from workbench.ui import RunsView
    RunsView()              # runs under WORKBENCH_RUN_ROOT or runs/
"""

from __future__ import annotations

import html
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.launch.history import runs
from workbench.ui.tables import RUN_LABELS, header_cell, scrolling

if TYPE_CHECKING:
    import pandas as pd

    from workbench.ui.dashboard import Dashboard

SHOWN = ["name", "status", "start", "duration_s", "world_size", "effective_batch", "base_lr", "lr", "rule", "steps",
         "last_loss", "best_loss"]
CELL = "padding:2px 8px;text-align:right;color:var(--jp-ui-font-color1,#222)"
TEXT_COLUMNS = ("name", "status", "start", "rule")


class RunsView:
    """The runs under `root` (a table), a multi-select of them and what can be done with the selection."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = root
        self.frame: pd.DataFrame = runs(root)
        self.dashboard: Dashboard | None = None
        self.table = w.HTML()
        self.select = w.SelectMultiple(options=[], rows=6, description="runs",
                                       layout=w.Layout(width="640px", max_width="100%"))
        self.buttons = {name: w.Button(description=name, icon=icon, tooltip=tip) for name, icon, tip in (
            ("Refresh", "refresh", "read the run folders again"),
            ("Open", "eye", "show the dashboard of the (first) selected run"),
            ("Compare", "line-chart", "loss and validation metrics of the selected runs by samples seen"),
            ("Cancel", "stop", "stop the selected runs that are still going"),
            ("Resume", "play", "submit the selected run's config again into its folder: it continues from "
                               "its latest checkpoint"))}
        for name, button in self.buttons.items():
            button.on_click(lambda _b, name=name: self._act(name))
        self.message = w.HTML()
        self.detail = w.VBox()
        self.widget = w.VBox([self.table, self.select, w.HBox(list(self.buttons.values())), self.message,
                              self.detail])
        self._show()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    @property
    def selected(self) -> list[str]:
        return list(self.select.value)

    def refresh(self) -> None:
        self.frame = runs(self.root)
        self._show()

    def _show(self) -> None:
        self.table.value = runs_html(self.frame)
        options = [(f"{r['name']} · {r['status']}", r["folder"]) for _, r in self.frame.iterrows()]
        keep = [f for f in self.select.value if f in {value for _, value in options}]
        self.select.options = options
        self.select.value = tuple(keep)

    # --- actions ---------------------------------------------------------------------------------
    def _act(self, name: str) -> None:
        try:
            text = getattr(self, name.lower())()
        except Exception as exc:  # noqa: BLE001 - a button callback: show it, don't lose it in a log
            text = f"✘ {name.lower()} failed: {type(exc).__name__}: {exc}"
        self.message.value = f"<span style='color:var(--jp-ui-font-color1,#222)'>{html.escape(text or '')}</span>"

    def open(self) -> str:
        from workbench.launch.run import Run

        if not self.selected:
            return "select a run first"
        if self.dashboard is not None:
            self.dashboard.stop()
        self.dashboard = Run.load(self.selected[0]).dashboard()
        self.detail.children = [self.dashboard.widget]
        return f"dashboard of {Path(self.selected[0]).name}"

    def compare(self) -> str:
        from workbench.launch.history import compare

        if len(self.selected) < 2:
            return "select two or more runs to compare"
        fig = compare(self.selected, x="samples")
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=90)
        self.detail.children = [w.Image(value=out.getvalue(), format="png", layout=w.Layout(max_width="100%"))]
        return f"compared {len(self.selected)} runs by samples seen"

    def cancel(self) -> str:
        from workbench.launch.run import Run

        done = []
        for folder in self.selected:
            run = Run.load(folder)
            if not run.status().done:
                run.cancel()
                done.append(Path(folder).name)
        self.refresh()
        return f"cancelled {', '.join(done)}" if done else "no selected run is still going"

    def resume(self) -> str:
        import workbench
        from workbench.launch.run import Run

        if len(self.selected) != 1:
            return "select one run to resume"
        run = Run.load(self.selected[0])
        if not run.status().done:
            return f"{run.folder.name} is still going"
        resumed = workbench.submit(run.config, run_dir=run.folder)
        self.refresh()
        if self.dashboard is not None:
            self.dashboard.stop()
        self.dashboard = resumed.dashboard()
        self.detail.children = [self.dashboard.widget]
        return f"resumed {run.folder.name} from its latest checkpoint"


def runs_html(frame: pd.DataFrame) -> str:
    """The runs as a table: one line per run (names and times never wrap), column names that wrap
    after an underscore, every column there (it scrolls sideways when wider than the widget)."""
    if not len(frame):
        return "<span style='color:var(--jp-ui-font-color1,#222)'>no runs yet</span>"
    shown = [c for c in SHOWN if c in frame] + [c for c in frame.columns if c.startswith("val_")]
    head = "".join(header_cell(c, _align(c, wrap=True), RUN_LABELS) for c in shown)
    rows = "".join("<tr>" + "".join(f"<td style='{_align(c)}'>{_cell(row[c])}</td>" for c in shown) + "</tr>"
                   for _, row in frame.iterrows())
    return scrolling(f"<table class='wb-runs'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")


def _align(column: str, wrap: bool = False) -> str:
    """Numbers to the right, words to the left; a cell does not wrap (a name or a time stays on its
    line), a header may (after an underscore)."""
    side = "left" if column in TEXT_COLUMNS else "right"
    return f"{CELL};text-align:{side}" + ("" if wrap else ";white-space:nowrap")


def _cell(value: Any) -> str:
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "—"
    if isinstance(value, pd.Timestamp):
        return value.tz_convert(None).strftime("%Y-%m-%d %H:%M") if value.tzinfo else value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))
