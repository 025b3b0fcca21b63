"""SweepView: a sweep live in the notebook - its trial table, its figure (the metric against each swept
field, the trials' curves) and a Cancel button, over the Sweep API (`sweep.frame()`, `sweep.plot()`,
`sweep.cancel()`).

    sweep = workbench.sweep(cfg, {"train.lr": [1e-3, 3e-3]})
    sweep.view()                 # or SweepView(sweep)
"""

from __future__ import annotations

import html
import io
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.ui.tables import RUN_LABELS, header_cell, scrolling

if TYPE_CHECKING:
    from workbench.sweeps.driver import Sweep

CELL = "padding:2px 8px;text-align:right;color:var(--jp-ui-font-color1,#222)"


class SweepView:
    """Table, figure and Cancel for `sweep`; a daemon thread refreshes them every `poll_s` seconds
    until the sweep is done (`refresh()` updates once)."""

    def __init__(self, sweep: Sweep, poll_s: float = 2.0, start: bool = True):
        self.sweep, self.poll_s = sweep, poll_s
        self.title = w.HTML()
        self.table = w.HTML()
        self.figure = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.cancel_button = w.Button(description="Cancel", icon="stop", tooltip="stop every trial (sweep.cancel())")
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.message = w.HTML()
        self.events = w.HTML()
        self.widget = w.VBox([self.title, self.table, self.figure, w.HBox([self.cancel_button, self.message]),
                              self.events])
        self.widget.add_class("wb-sweep")  # what a page (and a browser test) finds the view by
        self.title.add_class("wb-sweep-title")
        self.table.add_class("wb-sweep-table")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshing = threading.Lock()
        """One refresh at a time: the loop's, begun before a cancel, never writes over the cancel's own."""
        self.refresh()
        if start and not sweep.done:
            self._thread = threading.Thread(target=self._loop, name="workbench-sweep-view", daemon=True)
            self._thread.start()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.refresh()
            if self.sweep.done:
                self.refresh()
                return

    def stop(self) -> None:
        self._stop.set()

    def refresh(self) -> None:
        """Read the sweep once and set every widget."""
        with self._refreshing:
            self._refresh()

    def _refresh(self) -> None:
        frame = self.sweep.frame()
        done = self.sweep.count_done()
        state = "cancelled" if self.sweep.cancelled else "done" if self.sweep.done else "running"
        self.title.value = (f"<b>{html.escape(self.sweep.name)}</b> · {state} · {done}/{self.sweep.trials} "
                            f"trials · metric {html.escape(self.sweep.metric)} · "
                            f"pruner {html.escape(self.sweep.pruner)}")
        self.table.value = frame_html(frame)
        self.cancel_button.disabled = self.sweep.done
        self.events.value = "<br>".join(html.escape(line) for line in self.sweep.events[-6:])
        fig = self.sweep.plot()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        self.figure.value = buffer.getvalue()

    def cancel(self) -> None:
        self.message.value = "cancelling every trial..."
        try:
            self.sweep.cancel()
        except Exception as exc:  # noqa: BLE001 - a button callback: show it, don't lose it in a log
            self.message.value = html.escape(f"✘ cancel failed: {type(exc).__name__}: {exc}")
            return
        self.message.value = "cancelled: every trial's run stopped"
        self.refresh()


def frame_html(frame: Any) -> str:
    """The trial table as HTML (numbers to 4 significant digits; the run folder's name only)."""
    shown = [c for c in frame.columns if c != "run"]
    head = "".join(header_cell(str(c), CELL, RUN_LABELS) for c in shown)
    rows = []
    for _, row in frame.iterrows():
        cells = "".join(f"<td style='{CELL}'>{html.escape(_cell(row[c]))}</td>" for c in shown)
        rows.append(f"<tr>{cells}</tr>")
    return scrolling(f"<table><tr>{head}</tr>{''.join(rows)}</table>")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
