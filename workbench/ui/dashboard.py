"""Dashboard: a live view of a Run - loss per rank, throughput, rank badges, progress, logs, errors.

A daemon thread polls the run every `poll_s` seconds and only sets widget traits (values, PNG bytes);
it never prints into an Output widget, so the kernel stays free and nothing lands in the wrong cell.
The logic lives in plain Python (`state.read_state` -> DashboardState); the plot is a MetricsPlot
(ipympl: zoom, pan, hover; only the data is redrawn on a refresh); this module maps it onto widgets.
"""

from __future__ import annotations

import html
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from workbench.errors import SubmitError
from workbench.launch.pooljob import PoolJob
from workbench.launch.run import SCHEDULER_RETRY_S
from workbench.results.plots import rank_colour
from workbench.runfolder.rankstate import ACTIVE
from workbench.ui.plotview import MetricsPlot, page_script
from workbench.ui.state import DashboardState, read_state

if TYPE_CHECKING:
    from workbench.launch.run import Run

BAR_STYLES = {"finished": "success", "failed": "danger", "cancelled": "warning", "pruned": "warning"}
"""The progress bar's colour by the run's state (workbench.launch.status.TERMINAL; "info" while it goes on)."""
LOG_TAIL_BYTES = 6000
LOG_EVERY_S = 2.0


class Dashboard:
    """Live widgets for `run`; `refresh()` updates once, the poller thread keeps them current."""

    def __init__(self, run: Run, poll_s: float = 1.0, autostart: bool = True, **plot_options: Any):
        self.run, self.poll_s = run, poll_s
        self.plot = MetricsPlot(key=str(run.folder), **plot_options)
        self.state: DashboardState | None = None
        self._callbacks: list[Callable[[DashboardState], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._plot_version: tuple[int, bool] = (-1, False)
        self._log_read_at = 0.0
        self._cancel_problem = ""
        self._on_pool = isinstance(getattr(run, "job", None), PoolJob)
        self._build_widgets()
        if autostart:
            self.start()

    # --- widgets ---------------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        self.title = w.HTML(f"<b>{html.escape(str(self.run.folder))}</b>")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps", bar_style="info")
        self.eta = w.HTML()
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="danger",
                                      tooltip="Stop every rank (run.cancel())")
        self.cancel_button.on_click(lambda _: self.cancel())
        self.cancel_button.add_class("wb-cancel")
        self.gone = w.HTML(gone_html(self.run.folder, None, self._on_pool))
        """Shown by the page alone once the kernel is gone (hidden while it answers: see gone_html)."""
        self.badges = w.HTML()
        self.health = w.HTML()
        self.stacks = w.HTML()
        self.report = w.HTML()
        self.failure = w.HTML(layout=w.Layout(display="none"))
        self.restarts = w.HTML()
        self.error = w.HTML()
        self.scheduler = w.HTML(layout=w.Layout(display="none"))
        """One line while SLURM cannot be asked about the job (SLURM's own message); hidden otherwise."""
        ranks = [(f"rank {r}", r) for r in range(max(1, self.run.world_size))]
        self.rank_select = w.Dropdown(options=ranks, value=0, description="log of",
                                      layout=w.Layout(width="200px"))
        self.rank_select.observe(lambda _: self._show_log(force=True), names="value")
        self.log = w.HTML()
        self.downloads = {fmt: w.Button(description=fmt.upper(), icon="download", layout=w.Layout(width="100px"),
                                        tooltip=f"every rank's metrics as {fmt.upper()} (Run.export_metrics)")
                          for fmt in ("csv", "parquet")}
        for fmt, button in self.downloads.items():
            button.on_click(lambda _b, fmt=fmt: self.download(fmt))
            button.add_class("wb-download-button")
        self._downloads_made = 0
        self.download_link = w.HTML()
        header = w.HBox([self.title, self.progress, self.eta, self.cancel_button],
                        layout=w.Layout(flex_flow="row wrap", align_items="center"))
        metrics = w.HBox([w.HTML("metrics:"), *self.downloads.values(), self.download_link, page_script(FOLLOW_LINK)],
                         layout=w.Layout(align_items="center"))
        self.widget = w.VBox([header, self.gone, self.scheduler, self.badges, self.health, self.plot.widget,
                              metrics, self.failure, self.restarts, self.stacks, self.report, self.rank_select,
                              self.log, self.error])
        self.widget.add_class("wb-dashboard")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # --- polling ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the poller thread (returns at once)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll_loop, name="workbench-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the poller thread (the widgets keep their last values)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, 3 * self.poll_s))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _poll_loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                state = self.refresh()
            except Exception:  # noqa: BLE001 - show it and keep polling: the files may settle
                self.error.value = f"<pre style='color:#a94442'>{html.escape(traceback.format_exc())}</pre>"
            else:
                self.error.value = ""
                if state.done:
                    return  # that refresh saw the final state: it was the last one
            next_at = max(next_at + self.poll_s, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def on_refresh(self, callback: Callable[[DashboardState], None]) -> None:
        """Call `callback(state)` after each refresh has set the widgets (from the poller thread)."""
        self._callbacks.append(callback)

    def refresh(self) -> DashboardState:
        """Read the run once and update every widget; returns the new state."""
        with self._lock:
            state = read_state(self.run)
            self._apply(state)
            self.state = state
        for callback in list(self._callbacks):
            callback(state)
        return state

    def download(self, fmt: str) -> None:
        """Write the metrics as CSV or Parquet into the run folder and offer them as a download link."""
        try:
            path = self.run.export_metrics(format=fmt)
        except (ImportError, OSError, ValueError) as exc:
            text = html.escape(str(exc))
            self.download_link.value = f"<span style='color:var(--jp-ui-font-color1,#222)'>✘ {text}</span>"
            return
        self._downloads_made += 1  # a new link each time, even to the same file: the page follows it once
        self.download_link.value = download_html(path).replace("<a ", f"<a data-wb-n='{self._downloads_made}' ", 1)

    def cancel(self) -> None:
        try:
            self.run.cancel()
        except SubmitError as exc:  # SLURM does not answer (sacct, scancel): one line, the button stays
            self._cancel_problem = f"the run was not cancelled: {exc}"
            self.show_scheduler(self._cancel_problem)
            return
        self._cancel_problem = ""
        self.cancel_button.disabled = True
        self.cancel_button.description = "Cancelling"

    def show_scheduler(self, problem: str, ended: bool = False) -> None:
        """The one-line banner for what SLURM said ("" hides it); `ended`: the ranks said how the run ended."""
        self.scheduler.value = scheduler_html(problem, ended)
        self.scheduler.layout.display = "" if problem else "none"

    # --- state -> widgets ------------------------------------------------------------------------
    def _apply(self, state: DashboardState) -> None:
        problem = (self._cancel_problem if not state.done else "") or state.scheduler_error
        self.show_scheduler(problem, state.done)  # one line while SLURM does not answer (or refused a cancel)
        drawn = (state.data.version, state.done)
        if drawn != self._plot_version:  # the snapshot's own data: the curves end where the badges say
            # The figure first, then the lines that describe it: a draw takes seconds on a loaded machine, and
            # lines sent before it stood over the last figure meanwhile ("finished · step 128/128" and "step
            # 1 – 128" over one point of rank 1, two dashboards in Chromium at load 6)
            self.plot.show(state.data, state.evals, live=not state.done, total_steps=state.total_steps)
            self._plot_version = drawn
        self._show_progress(state)
        self.gone.value = gone_html(self.run.folder, time.time(), self._on_pool,  # when this refresh's figures are
                                    state.state if state.done else "")
        self.badges.value = badges_html(state)
        self.health.value = health_html(state.health)
        self.stacks.value = stacks_html(state.stacks)
        self._show_failure(state)
        self.restarts.value = restarts_html(state.earlier_failures)
        self._show_log(force=state.done)
        if state.done:
            self.cancel_button.disabled = True
            self.cancel_button.description = state.state
            self.cancel_button.button_style = {"finished": "success", "failed": "danger"}.get(state.state, "")
            if state.state == "finished" and not self.report.value:
                self.report.value = report_html(self.run)

    def _show_progress(self, state: DashboardState) -> None:
        total = state.total_steps or max(state.step, 1)
        self.progress.max = max(total, 1)
        self.progress.value = min(state.step, self.progress.max)
        self.progress.bar_style = BAR_STYLES.get(state.state, "info")
        self.eta.value = progress_text(state)

    def _show_failure(self, state: DashboardState) -> None:
        if not state.failure:
            self.failure.layout.display = "none"
            return
        ranks = [value for _, value in self.rank_select.options]
        if self.failure.layout.display == "none" and state.failed_rank in ranks:
            self.rank_select.value = state.failed_rank  # once: show the failing rank's log too
        self.failure.value = failure_html(state)
        self.failure.layout.display = ""

    def _show_log(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._log_read_at < LOG_EVERY_S:
            return
        self._log_read_at = time.monotonic()
        rank = int(self.rank_select.value)
        self.log.value = log_html(self.run.logs(rank, tail_bytes=LOG_TAIL_BYTES), rank)


FOLLOW_LINK = """
(function () {
  // One click downloads: after a click on CSV or Parquet, the link the kernel writes for it is followed
  // once (its download attribute saves the file).  Only after such a click: a reloaded page shows the
  // last link without fetching it again.
  function attach(tries) {
    const boxes = [...document.querySelectorAll(".wb-dashboard")].filter(b => !b.dataset.wbFollow);
    for (const box of boxes) {
      box.dataset.wbFollow = "1";
      let armed = false;
      box.addEventListener("click", e => { if (e.target.closest(".wb-download-button")) armed = true; }, true);
      new MutationObserver(() => {
        const link = box.querySelector("a.wb-download");
        if (armed && link && !link.dataset.wbFollowed) {
          armed = false;
          link.dataset.wbFollowed = "1";
          link.click();
        }
      }).observe(box, {childList: true, subtree: true});
    }
    if (!boxes.length && tries < 300) setTimeout(() => attach(tries + 1), 100);
  }
  attach(0);
})();
"""
"""Where it does not run (an untrusted notebook, another frontend) the link is there to click."""


def download_html(path: Any) -> str:
    """A link that downloads `path` through the Jupyter server this kernel belongs to (its /files/
    URL: the file is served, not carried in the page), and where it lies."""
    from pathlib import Path

    path = Path(path).resolve()
    size = path.stat().st_size
    where = f"<code>{html.escape(str(path))}</code> ({size / 2**20:.1f} MiB)"
    url = files_url(path)
    if url is None:
        return (f"<span style='color:var(--jp-ui-font-color1,#222)'>written to {where} (outside the folder "
                "the Jupyter server serves: open it from there)</span>")
    return (f"<a class='wb-download' download='{html.escape(path.name)}' href='{html.escape(url)}' target='_blank' "
            f"style='color:var(--jp-content-link-color,#1976d2)'>download {html.escape(path.name)}</a> "
            f"<span style='color:var(--jp-ui-font-color1,#222)'>· {where}</span>")


def files_url(path: Any) -> str | None:
    """The URL under which the Jupyter server running this kernel serves `path` (base_url + files/ +
    the path inside its root folder), or None when no such server is known or the file is outside
    its root.  The server is found by its runtime file (jupyter --runtime-dir): the kernel's parent
    process, else the only server whose root holds the file."""
    import json
    import os
    from pathlib import Path
    from urllib.parse import quote

    from workbench.runfolder.private import read_bounded

    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:
        return None
    servers = []
    for info_file in Path(jupyter_runtime_dir()).glob("jpserver-*.json"):
        try:
            info = json.loads(read_bounded(info_file, 1 << 20))
            root = Path(info["root_dir"]).expanduser().resolve()
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if Path(path).is_relative_to(root):
            servers.append((info.get("pid") == os.getppid(), info, root))
    if not servers or (len(servers) > 1 and not any(mine for mine, _, _ in servers)):
        return None
    _, info, root = max(servers, key=lambda s: s[0])
    base = str(info.get("base_url") or "/")
    return base.rstrip("/") + "/files/" + quote(Path(path).relative_to(root).as_posix())


GONE_CSS = ("<style>.wb-gone{display:none}"
            ".jupyter-widgets-disconnected .wb-gone{display:block}"
            ".wb-dashboard.jupyter-widgets-disconnected .wb-cancel,"
            ".wb-cancel.jupyter-widgets-disconnected{display:none !important}"
            ".wb-dashboard.jupyter-widgets-disconnected::before,"
            ".wb-dashboard .jupyter-widgets-disconnected::before{content:none;display:none}</style>")
"""ipywidgets marks every view of a kernel that restarts `jupyter-widgets-disconnected` (its manager
drops the comms on "restarting"): the page itself, with no kernel to ask, then shows the note and
hides Cancel, whose click no longer reaches anything; the note stands for the broken-link icon
ipywidgets puts before each of the dashboard's ~20 widgets."""


def gone_html(folder: Any, at: float | None, pool: bool = False, ended: str = "") -> str:
    """The note a page shows once this dashboard's kernel is gone: since when its figures stand still
    (`at`: the last refresh's time), whether the run goes on (a warm pool's ranks end with the kernel
    that made the pool; `ended`: the run's final state, when that refresh saw it) and how to see it again."""
    again = html.escape(f"workbench.Run.load({str(folder)!r}).dashboard()")
    if ended:
        text = (f"<b>kernel disconnected</b>: the run had ended ({html.escape(ended)}) and this dashboard shows it "
                f"as it ended. To open it again, run <code>{again}</code> in a cell, or "
                f"<code>workbench show {html.escape(str(folder))}</code> in a terminal.")
    else:
        since = (f"its step, ETA and ages are from its last refresh at "
                 f"{time.strftime('%H:%M:%S', time.localtime(at))}" if at is not None else "it never read the run")
        fate = ("a run on a warm pool ends with the kernel that made the pool" if pool else
                "the run itself goes on without the kernel")
        text = (f"<b>kernel disconnected</b>: this dashboard no longer updates ({since}) and cannot cancel; {fate}. "
                f"To follow it again, run <code>{again}</code> in a cell, or "
                f"<code>workbench follow {html.escape(str(folder))}</code> in a terminal.")
    return (f"{GONE_CSS}<div class='wb-gone' style='border-left:5px solid #ad5700;padding:2px 8px;"
            f"color:var(--jp-ui-font-color1,#222)'>⚠ {text}</div>")


def progress_text(state: DashboardState) -> str:
    """The status's own progress line (the one `workbench show` prints), state in bold; a stalled
    run's line (RunStatus.stall_line: how long, at which step, which rank where) bold up to its colon."""
    if state.stall:
        head, _, rest = state.stall.partition(": ")
        return f"<span class='wb-progress wb-stalled'><b>‖ {html.escape(head)}:</b> {html.escape(rest)}</span>"
    head, _, rest = state.line.partition(" · ")
    return f"<span class='wb-progress'><b>{html.escape(head)}</b> · {html.escape(rest)}</span>"


def scheduler_html(problem: str, ended: bool = False) -> str:
    """One line: "workbench: SLURM cannot be asked about job 123: <SLURM's message> (the run may
    still be running; ...asks SLURM again every 10 s)"; "" when there is nothing to say.  `ended`:
    every rank said how the run ended, which the dashboard then shows without SLURM's word."""
    if not problem:
        return ""
    if ended:
        text = f"workbench: {problem} (every rank has said how the run ended: shown from its run folder)"
    else:
        text = (f"workbench: {problem} (the run may still be running; the dashboard shows its run folder and "
                f"asks SLURM again every {SCHEDULER_RETRY_S:g} s)")
    return (f"<div class='wb-scheduler' style='border-left:5px solid #ad5700;padding:2px 8px;"
            f"color:var(--jp-ui-font-color1,#222)'>⚠ {html.escape(text)}</div>")


def badges_html(state: DashboardState) -> str:
    spans = []
    for b in state.badges:
        # An age is true at the refresh that read it: shown while the rank is active (refreshed every
        # poll), not on a rank that ended (the poller stops at the run's final state; "1s ago" would stay).
        active = b.state in ACTIVE
        age = "" if b.heartbeat_age_s is None or not active else f"{b.heartbeat_age_s:.0f}s ago"
        silent = " · ⚠ silent (no heartbeat: hung?)" if b.silent else ""
        silent += " · ‖ stalled" if b.stalled else ""
        title = f"rank {b.rank}: {b.state} at step {b.step}" + (f", last heartbeat {age or 'never'}" if active else "")
        spans.append(  # background: the state's colour; left edge: the rank's line colour in the plots
            f'<span class="wb-badge wb-{html.escape(b.state)}" title="{html.escape(title)}" '
            f'style="background:{b.colour};color:white;border-radius:4px;padding:2px 6px;margin:0 4px 2px 0;'
            f'border-left:7px solid {rank_colour(b.rank)};display:inline-block">'
            f"rank {b.rank}: {html.escape(b.state)} @ {b.step}{' · ' + age if age else ''}{silent}</span>")
    return "".join(spans) or "<span>no ranks yet</span>"


def health_html(health: dict[str, Any]) -> str:
    """One line: parameters in sync, stragglers, stalled ranks, sharding warnings."""
    if not health:
        return ""
    parts = []
    if health.get("in_sync") is not None:
        parts.append("✔ parameters in sync" if health["in_sync"] else
                     f"✘ parameters diverged on ranks {health['diverged_ranks']} "
                     f"(first: {html.escape(str(health['first_diverged']))})")
    for rank, slower in sorted(health.get("stragglers", {}).items()):
        parts.append(f"⚑ rank {rank} is a straggler ({100 * slower:.0f}% slower)")
    if health.get("stalled_ranks"):
        parts.append(f"‖ stalled: ranks {health['stalled_ranks']} (stacks below)")
    if health.get("shards_ok") is False:
        parts.append("✘ data shards overlap or do not reshuffle")
    parts += [f"⚠ {html.escape(text)}" for text in health.get("warnings", [])[:3]]
    return "<span style='font-size:90%'>" + " · ".join(parts) + "</span>" if parts else ""


def report_html(run: Run) -> str:
    """The end-of-run report (time split, communication, stragglers, memory, advice), folded."""
    from workbench.results.analysis import format_report

    text = format_report(run.report())
    return (f"<details><summary>report: where the step time goes and what would help</summary>"
            f"<pre style='font-size:80%'>{html.escape(text)}</pre></details>")


def stacks_html(stacks: dict[int, str]) -> str:
    return "".join(f"<details><summary>stack dump of rank {rank}</summary><pre style='font-size:75%'>"
                   f"{html.escape(text)}</pre></details>" for rank, text in sorted(stacks.items()))


def failure_html(state: DashboardState) -> str:
    return (f'<div style="border:2px solid #d9534f;padding:4px 8px"><b style="color:#a94442">'
            f"run failed (rank {state.failed_rank})</b><pre style='white-space:pre-wrap;font-size:85%'>"
            f"{html.escape(state.failure)}</pre></div>")


LOG_STYLE = ("max-height:220px;overflow:auto;font-size:80%;padding:4px 6px;margin:0;"
             "background:var(--jp-layout-color2,#eee);color:var(--jp-content-font-color1,#222)")
"""The theme's own pair (readable in light and dark themes)."""


def restarts_html(failures: list[str]) -> str:
    """Failed attempts that were restarted, folded: one summary line each, the traceback inside."""
    return "".join(f"<details><summary>↻ {html.escape(text.splitlines()[0])}</summary>"
                   f"<pre style='font-size:75%'>{html.escape(text)}</pre></details>" for text in failures)


def log_html(text: str, rank: int = 0) -> str:
    body = html.escape(text) if text else "(no output yet)"
    return (f"<pre class='wb-log' style='{LOG_STYLE};border-left:5px solid {rank_colour(rank)}'>{body}</pre>")
