"""The test layers are folders, and each folder is a marker: `tests/unit` (pure logic, starts no
process), `tests/process` (real processes, no DDP run), `tests/ddp` (real multi-process runs),
`tests/slurm`, `tests/notebooks`, `tests/browser`.  `python -m pytest -m unit` runs one layer."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.slurm_fixture"]

LAYERS = {"unit": "unit", "process": "process", "ddp": "ddp", "slurm": "slurm", "notebooks": "notebook",
          "browser": "browser"}
"""Folder under tests/ -> the marker every test in it carries."""


GROUPS = {"slurm": "machine", "notebooks": "machine", "browser": "browser"}
"""Folder -> the xdist group its tests run in.  Under `-n` (pytest-xdist, `--dist loadgroup`) each group runs
in one worker, beside the rest: the browser tests share one JupyterLab; group "machine" holds what the
machine and the checkout have once: the SLURM test cluster (it owns /etc/slurm; only tests/slurm and
notebook 03 use it), and the README and notebooks run in place (they share the checkout's runs/ folders)."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        folder = Path(str(item.fspath)).relative_to(here).parts[0]
        if folder in LAYERS:
            item.add_marker(getattr(pytest.mark, LAYERS[folder]))
        group = GROUPS.get(folder)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
