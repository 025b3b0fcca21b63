"""The test layers are folders, and each folder is a marker: `tests/unit` (pure logic, starts no
process), `tests/process` (real processes, no DDP run), `tests/ddp` (real multi-process runs),
`tests/slurm`, `tests/notebooks`, `tests/browser`.  `python -m pytest -m unit` runs one layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.support.exclusive", "tests.support.slurm_fixture", "tests.support.fixtures"]

LAYERS = {"unit": "unit", "process": "process", "ddp": "ddp", "slurm": "slurm", "notebooks": "notebook",
          "browser": "browser"}
"""Folder under tests/ -> the marker every test in it carries."""


GROUPS = {"slurm": "slurm", "notebooks": "checkout", "browser": "browser"}
"""Folder -> what its tests use that the machine has once.  Group "slurm": the SLURM test cluster (it owns
/etc/slurm); group "checkout": the README, the docs/ pages and the notebooks run in place (they share the
checkout's runs/ folders); group "browser": JupyterLab in Chromium, the heaviest thing a test starts.
Each such test holds that resource's file lock while it runs (`holds`, tests/support/exclusive.py), and a
test of another folder marked `slurm` (notebook 03) holds the "slurm" lock too: that is what makes the
suite right, serially, under any `-n` and any scheduler.  The same name as an xdist group (`--dist
loadgroup`) keeps a group on one worker, so its tests never wait on each other's lock; the SLURM tests and
the notebooks run beside each other on two of the workers, notebook 03 last in the SLURM group (`_holds_two`)."""


def _holds_two(item: pytest.Item) -> bool:
    """A test that holds two resources runs last, in the SLURM group.  Notebook 03 holds "checkout" and
    "slurm".  First in the checkout group, its worker waited for the other worker's whole SLURM group
    (the "slurm" lock is kept from one SLURM test to the next) with nothing to do: 5.4 minutes of a
    23-minute suite.  Last in the checkout group, still about 2 minutes.  Last in the SLURM group (about
    7 minutes), the checkout group (about 5) is done by then, and the other worker goes on to other tests."""
    from tests.support.exclusive import resources  # a plugin (above): imported by pytest first, rewritten

    return len(resources(item)) > 1


RUNS_PROCESSES = {"process", "ddp", "slurm", "notebooks"}
"""Layers whose tests start runs: after one fails, what it left running is stopped (tests/support/leftovers)."""


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile workbench and tests once, before any test (in xdist's controller, not each worker).
    Every rank, agent and controller a test starts imports them afresh, and where PYTHONDONTWRITEBYTECODE
    is set (as on this project's machines, CI's included) each would compile them from source again:
    about 0.1 s of CPU a process (the agent's, controller's and submit's modules: 0.49 s imported from
    byte-code, 0.58 s from source), several hundred processes a suite."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in ("workbench", "tests"):
        compileall.compile_dir(str(root / folder), quiet=2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed


CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _stop_what_a_failed_test_left(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    folder = Path(str(request.node.fspath)).relative_to(Path(__file__).parent).parts[0]
    if folder not in RUNS_PROCESSES:
        yield
        return
    from tests.support.leftovers import stop_what_is_left, sweeps_started

    sweeps = sweeps_started(monkeypatch)
    yield
    if request.node.stash.get(CALL_FAILED, False):
        tmp = request.node.funcargs.get("tmp_path")
        stopped = stop_what_is_left(Path(tmp) if tmp else None, sweeps)
        if stopped:
            print(f"\n[leftovers] the failed test left these running, now stopped: {stopped}", flush=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        folder = Path(str(item.fspath)).relative_to(here).parts[0]
        if folder in LAYERS:
            item.add_marker(getattr(pytest.mark, LAYERS[folder]))
        group = GROUPS.get(folder)
        if group:
            uses_slurm = group != "slurm" and item.get_closest_marker("slurm") is not None
            item.add_marker(pytest.mark.holds(group, *(["slurm"] if uses_slurm else [])))
            item.add_marker(pytest.mark.xdist_group("slurm" if uses_slurm else group))  # see _holds_two
    items[:] = sorted(items, key=_holds_two)  # stable: the others keep their order
