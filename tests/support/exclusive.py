"""What the machine has once is held by a file lock, so the suite is right under any scheduler.

A test marked `holds("checkout")` (tests/conftest.py marks whole folders) runs only while this process
holds the lock file `<LOCK_DIR>/checkout.lock` (fcntl.flock: the kernel drops it when its holder dies,
so a killed worker never leaves it held); one that holds two (`holds("checkout", "slurm")`: a
notebook that uses the SLURM test cluster) takes them in name order, as every process does.  Any number of pytest processes on the machine, xdist
workers or sessions side by side, take turns:

- the lock is taken before the test's setup and kept while the next test of this process holds the
  same resource, so the module and session fixtures those tests share (a SLURM job array, the
  checkout's runs/ folder) are never seen half-way by another process;
- the time spent waiting for it is outside the test's timeout (this hook wraps pytest-timeout's).

xdist's grouping (`--dist loadgroup`, the `xdist_group` marks conftest adds beside these) keeps such
tests on one worker, so in a normal run the lock is never contended; it is what keeps the suite right
when grouping does not happen (`-p no:xdist`, `--dist load`, or an xdist/pytest pair that drops the
groups, as pytest 9.2 does with xdist 3.8).

Outside a test, `held(name)` takes the same kind of lock around a step two processes must not do
at once (apt-get installing packages for two fixtures).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

LOCK_DIR = Path(os.environ.get("WB_TEST_LOCK_DIR", "/tmp/workbench-test-locks"))
"""Where the lock files live: one machine, one folder (WB_TEST_LOCK_DIR moves it, for the guard's own test)."""

MARKER = "holds"


@contextlib.contextmanager
def held(name: str) -> Iterator[float]:
    """Hold `<LOCK_DIR>/<name>.lock` exclusively for the block; yields the seconds spent waiting for it."""
    handle = _acquire(name)
    try:
        yield handle[1]
    finally:
        _release(handle[0])


def _acquire(name: str) -> tuple[IO[str], float]:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(LOCK_DIR / f"{name}.lock", "a")  # noqa: SIM115 - held past this function, closed by _release
    started = time.monotonic()
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\n")  # who holds it, for a person
    lock.flush()
    return lock, time.monotonic() - started


def _release(lock: IO[str]) -> None:
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def resources(item: pytest.Item | None) -> tuple[str, ...]:
    """The resources a test holds while it runs (sorted: the order they are taken in), or ()."""
    mark = item.get_closest_marker(MARKER) if item is not None else None
    return tuple(sorted({str(name) for name in mark.args})) if mark else ()


_HELD: dict[str, IO[str]] = {}
"""The locks this process holds now, by resource."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(*resources): runs only while holding the machine-wide lock of "
                                       "each resource (tests/support/exclusive.py)")


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's wrapper: waiting is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    names = resources(item)
    for other in [held_name for held_name in _HELD if held_name not in names]:
        _release(_HELD.pop(other))
    missing = [name for name in names if name not in _HELD]
    if missing and any(held_name > missing[0] for held_name in _HELD):
        for held_name in list(_HELD):  # locks are taken in one order everywhere: no two processes wait on each other
            _release(_HELD.pop(held_name))
        missing = list(names)
    waited = 0.0
    for name in missing:
        _HELD[name], took = _acquire(name)
        waited += took
    if waited >= 1.0:
        item.add_report_section("setup", "holds", f"waited {waited:.1f} s for the {', '.join(missing)} lock")
    try:
        return (yield)
    finally:
        following = resources(nextitem)
        for name in names:
            if name not in following and name in _HELD:
                _release(_HELD.pop(name))
