"""The form and the views as a user meets them, in real JupyterLab (headless Chromium, Playwright):

- typing "2.5" over micro_batch_size 32, key by key, never puts the "2" on the way in the scaling
  table: the table keeps the last config that was valid as a whole (32), labelled so;
- three problems are three items, in the form's banner and in the table's;
- "not submitted" goes once every field is fixed;
- the scaling table and the runs table stay inside their widget (they scroll sideways), run names
  stay on one line and every column can be scrolled to.

Screenshots go to test-artifacts/form-*.png and runs-table*.png.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from tests.support.browser_fixture import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    JupyterLab,
    commit_text,
    form_field,
    run_all_cells,
    wait_kernel_idle,
)
from tests.support.runs import write_run

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

LONG = "quickstart-20261122-101500-123"
CELLS = [
    """from pathlib import Path
from workbench.config import JobConfig
from workbench.ui import RunsView, Workbench
HERE = Path.cwd() / "form-views"
cfg = JobConfig.from_dict({"train": {"micro_batch_size": 32}, "launch": {"run_root": str(HERE / "submitted")}})
app = Workbench(cfg)
app""",
    """RunsView(HERE / "history")""",
]

# The box a table scrolls in, the widget output holding it, and whether its last column can be reached.
FIT_JS = """scroll => {
  const rect = e => e.getBoundingClientRect();
  const out = scroll.closest('.jp-OutputArea-output');
  scroll.scrollLeft = scroll.scrollWidth;
  const last = scroll.querySelector('th:last-child');
  const r = rect(scroll), o = rect(out), l = rect(last);
  return {right: r.right, outRight: o.right, scrolls: scroll.scrollWidth > scroll.clientWidth,
          overflowX: getComputedStyle(scroll).overflowX, lastInView: l.right <= r.right + 1 && l.left >= r.left - 1};
}"""


def _notebook(lab: JupyterLab) -> None:
    here = lab.root / "form-views"
    write_run(here / "history", LONG, 1, "none")
    write_run(here / "history", "lr-sweep-sqrt-rule-20261122-110000-789", 2, "sqrt")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "form.ipynb")






def _column(app, index: int) -> list[str]:
    return app.locator(f".wb-scaling tbody tr td:nth-child({index})").all_inner_texts()


def _fits(page, scroll) -> None:
    box = page.evaluate(FIT_JS, scroll.element_handle())
    assert box["right"] <= box["outRight"] + 1, box  # inside the widget's output, never past its edge
    assert box["overflowX"] == "auto" and box["lastInView"], box  # wider tables scroll to their last column


def test_form_commits_whole_values_lists_every_problem_and_tables_fit(chromium, jupyter_lab: JupyterLab):
    from playwright.sync_api import expect, sync_playwright

    _notebook(jupyter_lab)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(jupyter_lab.url("form.ipynb"), timeout=90_000)
            expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=90_000)
            wait_kernel_idle(page, 90_000)
            run_all_cells(page)
            expect(page.locator(".wb-runs")).to_be_visible(timeout=120_000)
            app = page.locator(".jp-OutputArea-output", has=page.locator(".wb-scaling"))
            assert set(_column(app, 3)) == {"32"}  # micro_batch_size, the config's

            app.locator(".jupyter-widget-Collapse-header", has_text=re.compile(r"^\s*train\s*$")).click()
            mbs = form_field(app, "micro_batch_size")
            mbs.click()
            mbs.press("Control+a")
            mbs.press_sequentially("2.5", delay=60)
            page.wait_for_timeout(1_000)  # while the field has the focus, nothing reaches the kernel
            expect(app.locator(".wb-stale")).to_have_count(0)
            mbs.press("Tab")
            stale = app.locator(".wb-stale")
            expect(stale).to_contain_text("got '2.5'")
            expect(stale).to_contain_text("last valid config")
            assert set(_column(app, 3)) == {"32"}, _column(app, 3)  # never the "2" typed on the way

            commit_text(form_field(app, "lr"), "abc")
            commit_text(form_field(app, "grad_accum_steps"), "x")
            expect(stale.locator("li")).to_have_count(3)
            expect(stale).to_contain_text("3 problem(s)")
            expect(app.locator(".wb-problems li")).to_have_count(3)
            app.locator("button.widget-button", has_text="Submit").click()
            expect(app.get_by_text("not submitted: the config has problems")).to_be_visible()
            mbs.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "form-three-problems.png"))

            commit_text(mbs, "16")
            commit_text(form_field(app, "lr"), "0.001")
            expect(app.get_by_text("not submitted: the config has problems")).to_be_visible()  # one left
            commit_text(form_field(app, "grad_accum_steps"), "2")
            expect(app.get_by_text("not submitted")).to_have_count(0)
            expect(app.get_by_text("ready to submit")).to_be_visible()
            expect(stale).to_have_count(0)
            assert set(_column(app, 3)) == {"16"}
            page.screenshot(path=str(ARTIFACTS / "form-fixed.png"))
            _fits(page, app.locator(".wb-table-scroll"))
            page.screenshot(path=str(ARTIFACTS / "form-table-scrolled.png"))

            runs = page.locator(".jp-OutputArea-output", has=page.locator(".wb-runs"))
            runs.scroll_into_view_if_needed()
            heights = runs.locator(".wb-runs tbody tr").evaluate_all("rows => rows.map(r => r.offsetHeight)")
            line = runs.locator(".wb-runs tbody td").first.evaluate("td => parseFloat(getComputedStyle(td).lineHeight)")
            assert heights and all(h < 1.8 * line for h in heights), (heights, line)  # one line per run
            expect(runs.locator(".wb-runs")).to_contain_text(LONG)
            page.screenshot(path=str(ARTIFACTS / "runs-table.png"))
            _fits(page, runs.locator(".wb-table-scroll"))
            page.screenshot(path=str(ARTIFACTS / "runs-table-scrolled.png"))
        finally:
            browser.close()
