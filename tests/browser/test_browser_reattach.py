"""A kernel restart in a real JupyterLab (headless Chromium, Playwright) while a run trains: the run
goes on, the old dashboard says its kernel is gone (no Cancel, how to follow the run again), and
`Run.load(folder).dashboard()` in the restarted kernel follows it until both ranks are finished.
The run holds after step 10 (tasks_for_tests.gated) until the reattached dashboard shows it running:
however slow the machine, it cannot end before the restart."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support import SCRIPTS
from tests.support.browser_fixture import ARTIFACTS, CHROMIUM_ARGS, JupyterLab, wait_kernel_idle
from tests.support.lifecycle import assert_nothing_left, report

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

CELLS = [
    """import os
import workbench
from workbench.config import JobConfig
cfg = JobConfig.from_dict({
    "task": {"name": "my_tasks:gated", "options": {"gate": os.path.abspath("gate"), "at_step": 10, "delay_s": 0.05,
                                                   "n_train": 2048, "n_val": 256}},
    "train": {"micro_batch_size": 16, "epochs": 100, "max_steps": 200, "checkpoint_every_steps": 50},
    "dist": {"procs_per_node": 2, "threads_per_rank": 1},
    "launch": {"run_root": "runs", "time_limit": "10"},
})
run = workbench.submit(cfg)
open("folder.txt", "w").write(str(run.folder))
run.dashboard()""",
    """import workbench
workbench.Run.load(open("folder.txt").read()).dashboard()""",
]


def _notebook(path: Path) -> None:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": source} for source in CELLS]
    path.write_text(json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}}}))


def _run_cell(page, index: int) -> None:
    """Select cell `index` and run it; pressed again if JupyterLab did not take the first key press
    (the prompt stays "[ ]": the editor had not got the focus yet), never once the cell has started."""
    from playwright.sync_api import expect

    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    for _ in range(3):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        try:
            expect(prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=10_000)
            return
        except AssertionError:
            continue
    raise AssertionError(f"cell {index} never started: its prompt is {prompt.inner_text()!r}")


def _debug(page, lab: JupyterLab, root: Path) -> str:
    """What the page and the run showed, for a failure message (and a screenshot in test-artifacts/)."""
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "reattach-failure.png"))
    except Exception:  # noqa: BLE001 - best effort while reporting another failure
        pass
    outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
    folder = root / "folder.txt"
    state = ""
    if folder.exists():
        import workbench

        state = workbench.Run.load(folder.read_text()).status().progress_line()
    return (f"cell outputs: {[o[-600:] for o in outputs[-4:]]}\nrun: {state or 'no folder.txt'}\n"
            f"server log tail:\n{lab.log_tail(1500)}")


def test_the_dashboard_reattaches_after_a_kernel_restart(chromium, jupyter_lab: JupyterLab):
    from playwright.sync_api import expect, sync_playwright

    import workbench

    _notebook(jupyter_lab.root / "reattach.ipynb")
    # the user's own task module beside the notebook (the kernel's and the ranks' working folder)
    shutil.copy(SCRIPTS.parent / "tasks_for_tests.py", jupyter_lab.root / "my_tasks.py")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(30_000)
            page.goto(jupyter_lab.url("reattach.ipynb"), timeout=90_000)
            try:
                wait_kernel_idle(page, 90_000)
                _run_cell(page, 0)
                first = page.locator(".jp-NotebookPanel .jp-Cell").nth(0)
                expect(first.locator(".wb-badge.wb-running")).to_have_count(2, timeout=150_000)
                folder = Path((jupyter_lab.root / "folder.txt").read_text())

                page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel")).first.click()
                page.locator(".jp-Dialog .jp-mod-accept").click()  # "Restart"
                restarted = time.monotonic()
                wait_kernel_idle(page, 60_000)
                run = workbench.Run.load(folder)
                assert run.status().state == "running", "the run must outlive its kernel"
                # the old dashboard says its kernel is gone, and how to follow the run again (issue 29 item 3)
                gone = first.locator(".wb-gone")
                expect(gone).to_be_visible(timeout=30_000)
                expect(gone).to_contain_text("kernel disconnected")
                expect(gone).to_contain_text(f"workbench.Run.load('{folder}').dashboard()")
                expect(first.locator("button.wb-cancel")).to_be_hidden()
                ARTIFACTS.mkdir(exist_ok=True)
                gone.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / "reattach-kernel-gone.png"))  # for a person to look at

                _run_cell(page, 1)
                second = page.locator(".jp-NotebookPanel .jp-Cell").nth(1)
                expect(second.locator(".wb-badge.wb-running")).to_have_count(2, timeout=60_000)
                expect(second.locator(".wb-gone")).to_be_hidden()  # the new kernel answers its dashboard
                expect(second.locator("button.wb-cancel")).to_be_visible()
                (jupyter_lab.root / "gate").touch()  # the run trains on to its end
                report("kernel restart in JupyterLab -> reattached dashboard shows the ranks",
                       time.monotonic() - restarted)
                expect(second.locator(".wb-badge.wb-finished")).to_have_count(2, timeout=180_000)
                expect(second.locator("button.widget-button", has_text="finished")).to_be_disabled(timeout=60_000)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{_debug(page, jupyter_lab, jupyter_lab.root)}") from exc
        finally:
            browser.close()
    assert run.wait(timeout=60).state == "finished"
    assert run.metrics().groupby("rank")["step"].max().tolist() == [200, 200]
    assert_nothing_left(folder)
