"""The quickstart notebook in a real browser: JupyterLab in headless Chromium, driven by Playwright.

Run All Cells, click the Workbench widget's Submit button, and wait until its dashboard shows both
ranks "finished" and the plot (an ipympl canvas).  A screenshot goes to test-artifacts/quickstart.png.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time

import pytest

from tests.support import REPO
from tests.support.browser_fixture import ARTIFACTS, CHROMIUM_ARGS, JupyterLab, run_all_cells, wait_kernel_idle

QUICKSTART = REPO / "notebooks" / "01_quickstart.ipynb"

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

PAGE_LOAD_MS = 90_000
CELLS_MS = 150_000  # Run All: kernel start, imports, the Workbench cell and a plain-API 2-rank run
RUN_MS = 150_000  # after the click: the widget's own 2-rank run until both ranks are finished






def _debug(page, lab: JupyterLab) -> str:
    with contextlib.suppress(Exception):  # best effort while reporting another failure
        page.screenshot(path=str(ARTIFACTS / "quickstart-failure.png"))
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    return f"stderr outputs: {errors[-3:]}\nserver log tail:\n{lab.log_tail(1500)}"


def test_quickstart_workbench_submit_shows_both_ranks_finished(chromium, jupyter_lab: JupyterLab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    shutil.copy(QUICKSTART, jupyter_lab.root / QUICKSTART.name)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "quickstart-failure.png").unlink(missing_ok=True)  # only this run's failure, if any
    started = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(jupyter_lab.url(QUICKSTART.name), timeout=PAGE_LOAD_MS)
            try:
                expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=PAGE_LOAD_MS)
                # The kernel is named in the notebook's metadata: JupyterLab starts it without asking.
                wait_kernel_idle(page, PAGE_LOAD_MS)
                run_all_cells(page)

                submit = page.locator("button.widget-button", has_text="Submit")
                expect(submit).to_have_count(1, timeout=CELLS_MS)
                app = page.locator(".jp-OutputArea-output", has=submit)  # the Workbench widget's output
                expect(app.locator(".wb-scaling")).to_be_visible()  # its scaling table rendered
                # The plain-API cells ran too: their dashboard shows both ranks finished.
                expect(page.locator(".wb-badge.wb-finished")).to_have_count(2, timeout=CELLS_MS)

                submit.scroll_into_view_if_needed()
                submit.click()
                # the form's status line (the log panel below may say "submitted" too, in submitit's words)
                expect(app.get_by_text(re.compile(r"✓ submitted /"))).to_be_visible(timeout=60_000)
                badges = app.locator(".wb-badge")
                expect(badges).to_have_count(2, timeout=RUN_MS)
                expect(app.locator(".wb-badge.wb-finished")).to_have_count(2, timeout=RUN_MS)
                expect(app.locator(".wb-badge.wb-failed")).to_have_count(0)
                texts = badges.all_inner_texts()
                assert [t.split(":")[0] for t in texts] == ["rank 0", "rank 1"], texts

                # The dashboard's final refresh: its Cancel button turns into the disabled final state.
                expect(app.locator("button.widget-button", has_text="finished")).to_be_disabled(timeout=60_000)

                canvas = app.locator(".jupyter-matplotlib-canvas-div canvas").first  # the ipympl figure
                expect(canvas).to_be_visible()
                # looked up at each try: a resize gives the figure a new canvas element
                page.wait_for_function("""out => {
                    const c = out.querySelector(".jupyter-matplotlib-canvas-div canvas");
                    return !!c && c.width > 200 && c.height > 200;
                }""", arg=app.element_handle(), timeout=30_000)
            except (AssertionError, PlaywrightTimeout) as exc:
                pytest.fail(f"{exc}\n{_debug(page, jupyter_lab)}", pytrace=False)

            # The screenshot: the Submit row at the top, the dashboard (badges, progress, plot) below it.
            app.locator(".widget-html", has_text="Scaling").first.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)
            shot = ARTIFACTS / "quickstart.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    print(f"browser flow done in {time.monotonic() - started:.1f} s; screenshot {shot}")
