"""The dashboard a researcher keeps open, in real JupyterLab (dark theme, 1100 px wide) in headless
Chromium: zooming the plot changes the range it shows, a double-click on Submit makes one run, the
scaling table's highlighted row and the log panel are readable (computed contrast >= 4.5:1), and the
Runs widget lists and compares two runs.  Screenshots go to test-artifacts/.

One JupyterLab and one page serve the module's tests (they run in file order); the run folders they
look at are written here, as the ranks write them (a 16-rank, 6000-step run among them).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from tests.support import REPO
from tests.support.browser_fixture import (  # noqa: F401 (chromium is a fixture)
    CHROMIUM_ARGS,
    chromium,
    start_jupyter_lab,
    wait_kernel_idle,
)
from tests.support.runs import write_run
from workbench.config import JobConfig
from workbench.runfolder.layout import RunDir, write_json_atomic
from workbench.runfolder.writer import JsonlWriter

ARTIFACTS = REPO / "test-artifacts"
pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]
DARK = {"@jupyterlab/apputils-extension/themes.jupyterlab-settings": {"theme": "JupyterLab Dark"}}
CELLS = [
    """import os
from pathlib import Path
from workbench.config import JobConfig
from workbench.launch.run import Run
from workbench.ui import RunsView, Workbench
ROOT = Path(os.environ["WORKBENCH_RUN_ROOT"])""",
    """wide = Run.load(ROOT / "wide")  # 16 ranks x 6000 steps, written by the test
plot = wide.plot(interactive=True, smooth=0.6)
plot""",
    """cfg = JobConfig.from_dict({"task": {"options": {"n_train": 256, "n_val": 32}},
                           "train": {"micro_batch_size": 16, "max_steps": 20, "grad_accum_steps": 2},
                           "dist": {"procs_per_node": 2, "threads_per_rank": 1},
                           "launch": {"run_root": str(ROOT / "submitted")}})
app = Workbench(cfg)
app.scaling.rule.value = "compare"
app""",
    """dash = Run.load(ROOT / "history" / "two-ranks").dashboard()
dash""",
    """RunsView(ROOT / "history")""",
]


def write_wide_run(folder: Path, ranks: int = 16, steps: int = 6000) -> None:
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": ranks}, "launch": {"run_root": str(folder.parent)}})
    run = RunDir(folder).prepare(cfg, "local")
    t0 = time.time() - steps * 0.1
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        writer = JsonlWriter(run.metrics(rank))
        noise = rng.normal(0, 0.03, steps)
        for i, step in enumerate(range(1, steps + 1)):
            base = 0.05 + 3.0 * np.exp(-step / 150)
            loss = base + noise[i] + 0.4 * (rank == 11)  # rank 11 strays: drawn on its own
            writer.write({"rank": rank, "step": step, "time": t0 + 0.1 * step, "loss": loss, "loss_reduced": base,
                          "lr": 1e-3, "step_time_s": 0.1 + 0.02 * (rank == 11), "samples_per_s": 320.0,
                          "mem_mb": 800.0 + rank})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": steps, "time": time.time()})
    write_json_atomic(run.summary, {"status": "finished"})


def write_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def browser(chromium):  # noqa: F811
    """One Playwright session and Chromium for the module (Playwright's sync API allows one at a time)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    from playwright.sync_api import expect

    from tests.support.browser_fixture import run_all_cells

    base = tmp_path_factory.mktemp("dark")
    root = base / "lab"
    root.mkdir()
    for name, values in DARK.items():  # the fixture's own settings are written beside these
        target = base / "lab-lab-settings" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    runs = root / "runs"
    write_wide_run(runs / "wide")
    write_run(runs / "history", "one-rank", 1, "none")
    write_run(runs / "history", "two-ranks", 2, "linear")
    (runs / "history" / "two-ranks" / "logs" / "1_0_log.out").write_text(
        "Starting with JobEnvironment\nstep 40: loss 0.125\n" * 20)  # what a rank prints
    write_notebook(root / "dashboard.ipynb")
    lab = start_jupyter_lab(root, {"WORKBENCH_RUN_ROOT": str(runs), "XDG_CONFIG_HOME": str(base / "config")})
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.set_default_timeout(60_000)
        page.goto(lab.url("dashboard.ipynb"), timeout=90_000)
        expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=90_000)
        wait_kernel_idle(page, 90_000)
        run_all_cells(page)
        expect(page.locator(".wb-runs")).to_be_visible(timeout=180_000)  # the last cell rendered
        page.lab = lab
        yield page
        page.close()
    finally:
        lab.stop()


def cell(page, index: int):
    return page.locator(".jp-NotebookPanel .jp-Cell").nth(index)


def test_zooming_the_plot_changes_the_range_it_shows(page):
    from playwright.sync_api import expect

    out = cell(page, 1)
    view = out.locator(".wb-view")
    expect(view).to_have_attribute("data-zoomed", "false", timeout=60_000)
    expect(out.locator(".widget-toggle-button.mod-active")).to_have_text("dark")  # follows JupyterLab's theme
    before = view.inner_text()
    wait_kernel_idle(page, 120_000)
    x0, y0, shown = drag_zoom_in_loss_panel(page, out, view)
    wait_kernel_idle(page, 120_000)
    # the figure the user sees is redrawn zoomed: its pixels change after the kernel took the zoom (the
    # range line above says so at once; the new image follows it, seconds later on a busy machine)
    page.wait_for_function(f"([cell, shown]) => ({IMAGE})(cell) !== shown", arg=[out.element_handle(), shown],
                           polling=500, timeout=60_000)
    after = view.inner_text()
    assert after != before
    low, high = (float(v.replace(",", "")) for v in re.findall(r"(-?[\d,]+) – (-?[\d,]+)", after)[0])
    assert 0 < high - low < 6000 * 0.6, after  # a part of the 6000 steps
    page.mouse.move(x0 + 40, y0 + 40)  # hover: the nearest point's rank and value
    hover = out.locator(".wb-hover")  # every series at the cursor's x (the kernel answers the move)
    expect(hover).to_contain_text("training loss · loss at step", timeout=30_000)
    expect(hover).to_contain_text("median")
    page.screenshot(path=str(ARTIFACTS / "dashboard-zoomed-16-ranks-dark.png"))


IMAGE = "cell => { const c = cell.querySelector('.jupyter-matplotlib-canvas-div canvas'); " \
        "return c ? c.toDataURL() : ''; }"
"""The figure's image as the browser shows it (ipympl's first canvas), looked up at each call."""


def settled_box(page, locator, quiet_ms: int = 1500, timeout_s: float = 120, min_height: float = 300) -> dict:
    """The element's box once the same element has not moved or resized for `quiet_ms`.  The figure
    gets a new canvas when its size changes (the kernel sizes it after the browser measures the
    output's width; on a busy machine that answer comes late), so the element itself is tagged and
    a new one starts the wait again.  The first image gives it its height (over `min_height`)."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        try:
            seen = locator.evaluate("el => el.dataset.wbSeen || (el.dataset.wbSeen = String(Math.random()))",
                                    timeout=10_000)
            now = (seen, locator.bounding_box(timeout=10_000))
        except PlaywrightError:  # replaced between the two calls: look again
            now = None
        if now != last:
            last, since = now, time.monotonic()
        elif now is not None and now[1] is not None and now[1]["height"] > min_height and (
                time.monotonic() - since) * 1000 >= quiet_ms:
            return now[1]
        page.wait_for_timeout(250)
    raise AssertionError(f"the figure kept changing for {timeout_s:.0f} s: {last}")


def drag_zoom_in_loss_panel(page, out, view, attempts: int = 3):
    """Zoom into the loss panel with the toolbar's Zoom tool.  The press position the kernel reads
    comes from the figure's size there, and a resize replaces the canvas (and its toolbar): a drag sent
    before the figure settled lands elsewhere or on a canvas that is gone, and zooms nothing.  Such a
    drag is made again on the settled figure (what a user does), at most `attempts` times."""
    canvas = out.locator(".jupyter-matplotlib-canvas-div")
    zoom = out.get_by_title(re.compile("Zoom to rectangle", re.I))
    for attempt in range(1, attempts + 1):
        try:
            box = settled_box(page, canvas)
            canvas.hover()  # the toolbar shows while the pointer is over the figure
            if "mod-active" not in (zoom.get_attribute("class") or ""):
                zoom.click()
            expect(zoom).to_have_class(re.compile("mod-active"))
            wait_kernel_idle(page, 120_000)  # the tool's mode has reached the kernel
            box = settled_box(page, canvas)
            # the loss panel is the top-left one (columns of panels under the legend): drag inside it, from
            # about a fifth of its width and height to about a third
            x0, y0 = box["x"] + 0.18 * box["width"], box["y"] + 0.20 * box["height"]
            shown = out.evaluate(IMAGE)  # what the user sees before the zoom
            page.mouse.move(x0, y0)
            page.mouse.down()
            page.mouse.move(x0 + 0.12 * box["width"], y0 + 0.10 * box["height"], steps=8)
            page.mouse.up()
            expect(view).to_have_attribute("data-zoomed", "true")
            return x0, y0, shown
        except (AssertionError, PlaywrightError):
            page.screenshot(path=str(ARTIFACTS / f"zoom-failure-{attempt}.png"))
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def test_a_double_click_on_submit_makes_one_run(page):
    from playwright.sync_api import expect

    out = cell(page, 2)
    submit = out.locator("button.widget-button", has_text="Submit")
    submit.scroll_into_view_if_needed()
    submit.dblclick()
    expect(out.get_by_text("submitted", exact=False)).to_be_visible(timeout=90_000)
    expect(out.locator(".wb-badge.wb-finished")).to_have_count(2, timeout=180_000)
    submitted = Path(page.lab.root) / "runs" / "submitted"
    assert len(list(submitted.glob("*/run.json"))) == 1
    expect(submit).to_be_enabled()
    # the dashboard's plot got the run's steps (its view line names their range, not the empty 0 - 1)
    expect(out.locator(".wb-view").last).to_contain_text(re.compile(r"step \d+ – [2-9]"), timeout=60_000)
    out.locator(".wb-plot").first.scroll_into_view_if_needed()  # its box: ipympl replaces the canvas on a resize
    # and the browser shows them: pixels of rank 0's line colour (#1f77b4) in the figure
    page.wait_for_function("""cell => {  // the canvas looked up at each try: a resize gives the figure a new one
        const c = cell.querySelector(".jupyter-matplotlib-canvas-div canvas");
        if (!c || !c.width || !c.height) return false;
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - 31) < 12 && Math.abs(d[i + 1] - 119) < 12 && Math.abs(d[i + 2] - 180) < 12) n++;
        return n > 40;
    }""", arg=out.element_handle(), timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "workbench-after-double-click-dark.png"))


def _contrast(page, selector: str) -> float:
    """Contrast of an element's text against the first opaque background behind it (alpha blended)."""
    colours = page.locator(selector).first.evaluate("""el => {
        const parse = s => (s.match(/[\\d.]+/g) || []).map(Number);
        const text = parse(getComputedStyle(el).color);
        let node = el, bg = null;
        while (node && node.nodeType === 1) {
            const c = parse(getComputedStyle(node).backgroundColor);
            if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) { bg = c; break; }
            node = node.parentElement;
        }
        return [text, bg || [255, 255, 255]];
    }""")
    text, bg = colours
    alpha = text[3] if len(text) == 4 else 1.0
    blended = [alpha * t + (1 - alpha) * b for t, b in zip(text[:3], bg[:3])]

    def luminance(rgb):
        lin = [(c / 255) / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    high, low = sorted((luminance(blended), luminance(bg[:3])), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_dark_theme_table_and_log_are_readable(page):
    from playwright.sync_api import expect

    assert page.evaluate("document.body.dataset.jpThemeLight") == "false"  # the dark theme is on
    row = cell(page, 2).locator(".wb-scaling tr.wb-selected td").first
    expect(row).to_be_visible()
    assert cell(page, 2).locator(".wb-scaling tr.wb-selected").count() == 1  # the config's own rule only
    table_contrast = _contrast(page, ".wb-scaling tr.wb-selected td")
    log = cell(page, 3).locator(".wb-log")
    expect(log).to_contain_text("step 40: loss 0.125", timeout=60_000)
    log_contrast = _contrast(page, ".wb-log")
    cell(page, 2).locator(".wb-scaling").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "dark-theme-form-and-table.png"))
    log.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "dark-theme-dashboard-log.png"))
    assert table_contrast >= 4.5 and log_contrast >= 4.5, (table_contrast, log_contrast)


def test_runs_widget_lists_and_compares_two_runs(page):
    from playwright.sync_api import expect

    out = cell(page, 4)
    table = out.locator(".wb-runs")
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table).to_contain_text("one-rank")
    expect(table).to_contain_text("two-ranks")
    out.locator("select").select_option(label=["one-rank · finished", "two-ranks · finished"])
    out.locator("button.widget-button", has_text="Compare").click()
    expect(out.get_by_text("compared 2 runs by samples seen")).to_be_visible(timeout=60_000)
    image = out.locator("img.widget-image")
    expect(image).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth > 500", arg=image.element_handle())
    out.screenshot(path=str(ARTIFACTS / "runs-widget-compare-dark.png"))


# --- curves a researcher trusts (issue 17): a 20,000-step run with a spike, and a live run ------------
SPIKE_STEPS, SPIKE_STEP, SPIKE = 20_000, 12_345, 3.0
CURVE_CELLS = [
    """import json, os, threading, time
from pathlib import Path
import ipywidgets as widgets
from workbench.launch.run import Run
ROOT = Path(os.environ["WORKBENCH_RUN_ROOT"])""",
    """spiky = Run.load(ROOT / "spiky").dashboard()  # 20,000 steps, rank 1 spikes once at step 12,345
spiky""",
    f"""spike_facts = widgets.HTML()
def tell_spike(state):  # what the kernel drew: rank 1's raw loss line as reduced for the screen
    live = spiky.plot.live
    ax = live.axes[0]
    raw = next(a for a in live.artists[0].values() if a.get_label() == "_raw rank 1")
    x_px, y_px = ax.transData.transform(({SPIKE_STEP}, {SPIKE} * 0.9))
    spike_facts.value = "<pre class='wb-spike-facts'>" + json.dumps({{
        "drawn_points": len(raw.get_xdata()), "drawn_max": float(max(raw.get_ydata())), "steps": len(raw.full_x),
        "x_px": float(x_px), "row_px": float(live.fig.bbox.height - y_px), "fig_width": float(live.fig.bbox.width),
        "title": ax.get_title(loc="left"), "yscale": ax.get_yscale(), "smooth": spiky.plot.opts.smooth}}) + "</pre>"
spiky.on_refresh(tell_spike)
while spiky.state is None:
    time.sleep(0.2)
tell_spike(spiky.state)
spiky.plot.live.fig.canvas.mpl_connect("draw_event", lambda _: tell_spike(spiky.state))  # a resize: again
spike_facts""",
    """live = Run.load(ROOT / "live").dashboard()  # the test writes its records as the ranks would
twin = live.run.dashboard()  # a second dashboard of the same handle, open at once (issue 29 item 9)
def facts_of(dash, name):
    facts = widgets.HTML()
    def tell(state):  # called by the refresh that set the widgets, with its own snapshot
        last = {k.split("/")[1]: v for k, v in dash.plot.live.last_x().items() if k.startswith("loss/rank")}
        facts.value = f"<pre class='wb-{name}-facts'>" + json.dumps({
            "step": state.step, "badges": {f"rank {b.rank}": b.step for b in state.badges}, "last_x": last,
            "extent": dash.plot.live.view_range().data, "line": state.line,
            "fig_width": dash.plot.live.fig.bbox.width}) + "</pre>"
    dash.on_refresh(tell)
    return facts
widgets.VBox([live.widget, facts_of(live, "live"), twin.widget, facts_of(twin, "twin")])""",
]


def write_spiky_run(folder: Path) -> None:
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(folder.parent)}})
    run = RunDir(folder).prepare(cfg, "local")
    t0 = time.time() - SPIKE_STEPS * 0.1
    rng = np.random.default_rng(0)
    for rank in range(2):
        writer = JsonlWriter(run.metrics(rank))
        noise = rng.normal(0, 0.01, SPIKE_STEPS)
        for i, step in enumerate(range(1, SPIKE_STEPS + 1)):
            loss = 1.26 if step == 1 else 0.08 + 0.5 * np.exp(-step / 400) + noise[i]
            loss = SPIKE if (step, rank) == (SPIKE_STEP, 1) else loss
            writer.write({"rank": rank, "step": step, "time": t0 + 0.1 * step, "loss": float(loss), "lr": 1e-3,
                          "step_time_s": 0.1 + noise[i], "samples_per_s": 320.0 * (1 + noise[i]),
                          "mem_mb": 800.0 + rank})
        writer.close()
        write_json_atomic(run.status(rank), {"rank": rank, "state": "finished", "step": SPIKE_STEPS,
                                             "time": time.time()})
    write_json_atomic(run.summary, {"status": "finished"})


class LiveWriter:
    """Writes a 2-rank run's records as ranks do (about 20 steps/s), with heartbeats a few steps ahead
    of the records (the engine's monitor reports the step it is on, the record follows); pausable."""

    def __init__(self, folder: Path, total: int = 3000):
        import os
        import threading

        cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2}, "launch": {"run_root": str(folder.parent)}})
        self.run = RunDir(folder).prepare(cfg, "local", job_id=str(os.getpid()))  # alive while this test is
        self.total = total
        self.paused, self.stopped = threading.Event(), threading.Event()
        self.step = 0
        events = JsonlWriter(self.run.events(0))
        events.write({"event": "start", "rank": 0, "step": 0, "time": time.time(), "total_steps": total,
                      "effective_batch": 16, "world_size": 2})
        events.close()
        self.thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        writers = [JsonlWriter(self.run.metrics(rank)) for rank in range(2)]
        beat = 0.0
        while not self.stopped.is_set() and self.step < self.total:
            if self.paused.is_set():
                time.sleep(0.05)
                continue
            self.step += 1
            for rank, writer in enumerate(writers):
                if rank == 1 and self.step % 7 == 0:
                    continue  # rank 1 trails a step now and then: the ranks' steps differ
                writer.write({"rank": rank, "step": self.step, "time": time.time(), "lr": 1e-3, "step_time_s": 0.05,
                              "loss": 0.1 + 2.0 / (1 + self.step / 50) + 0.01 * rank})
            if time.monotonic() - beat > 0.5:
                beat = time.monotonic()
                for rank in range(2):  # the heartbeat says the step the rank is on: ahead of its records
                    write_json_atomic(self.run.status(rank), {"rank": rank, "state": "running", "step": self.step + 4,
                                                              "time": time.time(), "pid": 1, "host": "test"})
            time.sleep(0.05)
        for writer in writers:
            writer.close()


@pytest.fixture(scope="class")
def curves(browser, tmp_path_factory):
    from playwright.sync_api import expect

    from tests.support.browser_fixture import run_all_cells

    root = tmp_path_factory.mktemp("curves") / "lab"
    root.mkdir()
    runs = root / "runs"
    write_spiky_run(runs / "spiky")
    writer = LiveWriter(runs / "live")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CURVE_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "curves.ipynb")
    lab = start_jupyter_lab(root, {"WORKBENCH_RUN_ROOT": str(runs), "XDG_CONFIG_HOME": str(root.parent / "config")})
    ARTIFACTS.mkdir(exist_ok=True)
    writer.thread.start()
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.set_default_timeout(60_000)
        page.goto(lab.url("curves.ipynb"), timeout=90_000)
        expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=90_000)
        wait_kernel_idle(page, 90_000)
        run_all_cells(page)
        expect(page.locator(".wb-live-facts")).to_be_visible(timeout=180_000)
        page.writer, page.lab = writer, lab
        yield page
        page.close()
    finally:
        writer.stopped.set()
        writer.thread.join(timeout=10)
        lab.stop()


def _facts(page, selector: str) -> dict:
    return json.loads(page.locator(selector).first.inner_text())


@pytest.mark.usefixtures("curves")
class TestCurves:
    def test_a_20000_step_runs_spike_is_drawn_at_default_settings(self, curves):
        from playwright.sync_api import expect

        page = curves
        expect(page.locator(".wb-spike-facts")).to_be_visible(timeout=120_000)
        facts = _facts(page, ".wb-spike-facts")
        assert facts["steps"] == SPIKE_STEPS and facts["smooth"] == pytest.approx(0.6)  # every step, default smoothing
        assert facts["drawn_max"] == SPIKE and facts["drawn_points"] < 4 * facts["fig_width"], facts  # M4 kept it
        assert facts["title"] == "training loss · loss" and facts["yscale"] == "log", facts  # 1.26 -> 0.08: log-y
        out = cell(page, 1)
        out.locator(".wb-plot").first.scroll_into_view_if_needed()  # its box: ipympl replaces the canvas on a resize
        # the browser's own pixels: rank 1's orange at the spike's top (faint: the raw series), not grey
        # grid, read once the figure has taken the output's width (the facts follow each draw)
        orange = page.wait_for_function("""cell => {
            const c = cell.querySelector(".jupyter-matplotlib-canvas-div canvas");  // the current one
            const f = JSON.parse(document.querySelector(".wb-spike-facts").innerText);
            if (!c || Math.abs(c.width - f.fig_width) > 1 || c.width < 500) return 0;
            const d = c.getContext("2d").getImageData(Math.round(f.x_px) - 3, Math.round(f.row_px) - 3, 7, 7).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4)
                if (d[i] > d[i + 1] + 15 && d[i] > d[i + 2] + 40) n++;
            return n;
        }""", arg=out.element_handle(), timeout=90_000).json_value()
        assert orange > 0
        width = out.locator(".wb-plot").first.bounding_box()["width"]
        assert abs(_facts(page, ".wb-spike-facts")["fig_width"] - width) < 12, width  # the figure fills the output
        out.locator(".wb-progress").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "dashboard-20000-steps-spike.png"))

    def test_the_csv_download_is_served_by_jupyter_not_carried_in_the_page(self, curves):
        from playwright.sync_api import expect

        page = curves
        out = cell(page, 1)
        with page.expect_download(timeout=120_000) as started:  # one click: the page follows the new link
            out.locator("button.widget-button", has_text="CSV").click()
        saved = started.value
        assert saved.suggested_filename == "metrics.csv"
        assert len(Path(saved.path()).read_text().strip().splitlines()) == 2 * SPIKE_STEPS + 1  # issue 29 item 10
        link = out.locator("a.wb-download")
        expect(link).to_be_visible(timeout=120_000)
        href = link.get_attribute("href")
        assert href == "/files/runs/spiky/exports/metrics.csv", href  # a URL the server answers, no data: link
        status, lines = page.evaluate("""async href => {  // as the link's click would: the page's own login
            const answer = await fetch(href);
            return [answer.status, (await answer.text()).trim().split("\\n").length];
        }""", href)
        assert (status, lines) == (200, 2 * SPIKE_STEPS + 1), (status, lines)  # a header and every rank's every step

    def test_two_live_dashboards_step_numbers_agree(self, curves):
        """Two dashboards of one live run, open at once (issue 29 item 9: the first's figure stayed blank,
        the second's range line read step 23 under a progress line at 146): each refresh's own snapshot
        agrees with itself, and each page shows one snapshot, its whole figure drawn."""
        page = curves
        page.wait_for_function("""() => [...document.querySelectorAll(".wb-live-facts, .wb-twin-facts")]
            .filter(f => JSON.parse(f.innerText).step >= 150).length == 2""", timeout=120_000)
        for _ in range(4):  # while records stream in: each refresh's own snapshot agrees with itself
            for name in ("live", "twin"):
                facts = _facts(page, f".wb-{name}-facts")
                assert facts["last_x"] == facts["badges"], facts  # each curve ends at its rank's badge
                assert facts["step"] == min(facts["badges"].values()), facts  # the progress line: the slowest rank
                assert facts["extent"][1] == max(facts["badges"].values()), facts  # the range line: the data's end
                assert f"step {facts['step']}/3000" in facts["line"], facts
            page.wait_for_timeout(700)
        page.writer.paused.set()  # hold still: what the page shows must be what the kernel drew
        out = cell(page, 3)
        progress = out.locator(".wb-progress")
        text = progress.all_inner_texts()
        for _ in range(40):  # each dashboard's next refresh shows the last records (under load, seconds apart)
            page.wait_for_timeout(1500)
            if progress.all_inner_texts() == text and len(set(text)) == 1:
                break
            text = progress.all_inner_texts()
        assert len(text) == 2 and text[0] == text[1], text  # one run, one reader: the same step on both
        for i, name in enumerate(("live", "twin")):
            facts = _facts(page, f".wb-{name}-facts")
            shown_step = int(re.search(r"step (\d+)/3000", text[i]).group(1))
            dash = out.locator(".wb-dashboard").nth(i)
            badges = {m.group(1): int(m.group(2)) for m in (re.search(r"(rank \d+): running @ (\d+)", b)
                                                             for b in dash.locator(".wb-badge").all_inner_texts())}
            view = dash.locator(".wb-view").inner_text()
            low, high = (int(v.replace(",", "")) for v in re.search(r"step ([\d,]+) – ([\d,]+)", view).groups())
            assert shown_step == facts["step"] == min(badges.values()), (name, text, badges, facts)
            assert badges == facts["badges"] == facts["last_x"], (name, badges, facts)
            assert (low, high) == (1, max(badges.values())) and "all data" in view, (name, view)
            assert shown_step < page.writer.step + 4  # the heartbeats said more: the snapshot's records rule
            # the browser shows the whole figure (axes, titles, curves) at the output's width, with nothing new
            # to draw: a canvas view that (re)connects gets the whole picture, not only the next change
            probe = """([dash, width]) => {
                const cs = [...dash.querySelectorAll(".jupyter-matplotlib-canvas-div canvas")];
                const c = cs[0];
                if (!c) return {n: 0};
                const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                let dark = 0;
                for (let i = 0; i < d.length; i += 4)
                    if (d[i] < 90 && d[i + 1] < 90 && d[i + 2] < 90 && d[i + 3] > 200) dark++;
                return {n: cs.length, width: c.width, want: width, dark: dark};
            }"""
            try:
                page.wait_for_function(f"args => {{ const f = ({probe})(args); "
                                       "return f.n && Math.abs(f.width - f.want) <= 1 && f.dark > 3000; }",
                                       arg=[dash.element_handle(), facts["fig_width"]], timeout=30_000)
            except PlaywrightError:
                page.screenshot(path=str(ARTIFACTS / f"dashboard-live-{name}-blank.png"))
                found = page.evaluate(probe, [dash.element_handle(), facts["fig_width"]])
                raise AssertionError((name, found)) from None
        out.locator(".wb-progress").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "dashboard-live-one-clock.png"))
        out.locator(".wb-dashboard").nth(1).locator(".wb-progress").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "dashboard-live-twin.png"))
        page.writer.paused.clear()
