"""The browser tests share one JupyterLab server (session scope) and one Chromium.  Fixtures are
registered here, once: a test module that imported `jupyter_lab` itself would start its own server.
After each test that used the server, the kernels it left are shut down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.browser_fixture import chromium, jupyter_lab  # noqa: F401 (fixtures, registered once)


@pytest.fixture(scope="session", autouse=True)
def _assertions_wait_for_a_busy_kernel() -> None:
    """A web-first assertion (`expect(...)`) waits up to 30 s, not Playwright's 5: what it waits for is
    often the kernel's answer, which takes seconds on two cores shared with another test run."""
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)


@pytest.fixture(autouse=True)
def _kernels_shut_down_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "jupyter_lab" in request.fixturenames:
        request.getfixturevalue("jupyter_lab").shutdown_kernels()
