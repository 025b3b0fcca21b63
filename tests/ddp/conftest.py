"""One finished run that read-only tests share (under xdist, one per worker that needs it)."""

from __future__ import annotations

import pytest

import workbench
from tests.support.runs import local_cfg


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> workbench.Run:
    """A healthy run of `local_cfg` (40 steps, 2 ranks), finished.  Tests only read it: a test that
    changes a run (resume, cancel, export into its folder) makes its own."""
    run = workbench.submit(local_cfg(tmp_path_factory.mktemp("finished")))
    assert run.wait(timeout=240).state == "finished", run.exception()
    return run
