"""The Workbench form turned into a sweep, as a user does it in real JupyterLab (headless Chromium):
type two learning rates into train.lr ("1e-3, 3e-3", as `workbench sweep --grid` writes them), see
"sweep: 2 trials" and the button turn into "Sweep 2 trials", click it, and watch the SweepView in the
app's output until both trials (real 2-rank runs, 20 steps) are finished.

Screenshots: test-artifacts/sweep-form-ready.png (the form before the click) and
sweep-form-done.png (the sweep view with both trials finished).
"""

from __future__ import annotations

import contextlib
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

pytest.importorskip("optuna")
pytestmark = [pytest.mark.browser, pytest.mark.timeout(480)]

SWEEP_MS = 300_000  # two 2-rank trials of 20 steps, two at a time, on a loaded 2-core machine
CELLS = [
    """from pathlib import Path
from workbench.config import JobConfig
from workbench.ui import Workbench
cfg = JobConfig.from_dict({
    "task": {"name": "synthetic", "options": {"n_train": 2048, "n_val": 256}},
    "train": {"micro_batch_size": 16, "max_steps": 20, "eval_every_steps": 10, "checkpoint_every_steps": None},
    "dist": {"procs_per_node": 2, "threads_per_rank": 1, "timeout_s": 120},
    "launch": {"run_root": str(Path.cwd() / "sweep-form" / "runs"), "time_limit": "10"},
})
app = Workbench(cfg)
app""",
]


def _notebook(lab: JupyterLab) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "sweep-form.ipynb")






def _debug(page, lab: JupyterLab) -> str:
    with contextlib.suppress(Exception):  # best effort while reporting another failure
        page.screenshot(path=str(ARTIFACTS / "sweep-form-failure.png"))
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    return f"stderr outputs: {errors[-3:]}\nserver log tail:\n{lab.log_tail(1500)}"


def test_two_learning_rates_typed_into_the_form_sweep_two_real_trials(chromium, jupyter_lab: JupyterLab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    from workbench.sweeps.driver import Sweep

    _notebook(jupyter_lab)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "sweep-form-failure.png").unlink(missing_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(jupyter_lab.url("sweep-form.ipynb"), timeout=90_000)
            try:
                expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=90_000)
                wait_kernel_idle(page, 90_000)
                run_all_cells(page)
                app = page.locator(".jp-OutputArea-output", has=page.locator(".wb-scaling"))
                expect(app).to_have_count(1, timeout=120_000)
                button = app.locator("button.widget-button", has_text=re.compile(r"^\s*(Submit|Sweep)"))
                expect(button).to_have_text(re.compile(r"^\s*Submit\s*$"))

                app.locator(".jupyter-widget-Collapse-header", has_text=re.compile(r"^\s*train\s*$")).click()
                commit_text(form_field(app, "lr"), "1e-3, 3e-3")
                note = app.locator(".wb-sweep-note")
                expect(note).to_contain_text("sweep: 2 trials (train.lr)")
                expect(note).to_contain_text("the table shows the first point (train.lr=0.001)")
                expect(button).to_have_text(re.compile(r"^\s*Sweep 2 trials\s*$"))
                commit_text(form_field(app, "parallel"), "2")
                expect(app.locator(".wb-problems")).to_have_count(0)  # the config is valid
                note.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / "sweep-form-ready.png"))

                button.click()
                expect(app.get_by_text(re.compile(r"✓ sweep started: .*sweep-"))).to_be_visible(timeout=120_000)
                view = app.locator(".wb-sweep")
                expect(view).to_be_visible()
                title = view.locator(".wb-sweep-title")
                expect(title).to_contain_text(re.compile(r"done · 2/2 trials"), timeout=SWEEP_MS)
                rows = view.locator(".wb-sweep-table tr")
                expect(rows).to_have_count(3)  # the header and one row per trial
                expect(rows.filter(has_text="finished")).to_have_count(2)
                expect(view.locator("button.widget-button", has_text="Cancel")).to_be_disabled()
                expect(button).to_have_text(re.compile(r"^\s*Sweep 2 trials\s*$"))  # ready for another

                # A choice field's list button: its values typed out, a 2 x 2 grid; one value each: Submit.
                several = app.locator("button[title='sweep several values of train.optimizer']")
                several.click()
                commit_text(form_field(app, "optimizer"), "adamw, sgd")
                expect(note).to_contain_text("sweep: 2 x 2 = 4 trials (train.optimizer, train.lr)")
                expect(button).to_have_text(re.compile(r"^\s*Sweep 4 trials\s*$"))
                several.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / "sweep-form-choice.png"))
                several.click()
                commit_text(form_field(app, "lr"), "0.001")
                expect(button).to_have_text(re.compile(r"^\s*Submit\s*$"))
                expect(note).to_be_hidden()
            except (AssertionError, PlaywrightTimeout) as exc:
                pytest.fail(f"{exc}\n{_debug(page, jupyter_lab)}", pytrace=False)
            view.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "sweep-form-done.png"))
        finally:
            browser.close()

    # What the click started, read back from the sweep folder: two real runs, one per learning rate.
    folders = list((jupyter_lab.root / "sweep-form" / "runs").glob("sweep-*"))
    assert len(folders) == 1, folders
    frame = Sweep.load(folders[0], resume=False).frame()
    assert sorted(frame["train.lr"]) == [1e-3, 3e-3] and set(frame["state"]) == {"finished"}, frame
    assert (frame["steps"] == 20).all() and frame["val_loss_last"].notna().all(), frame
