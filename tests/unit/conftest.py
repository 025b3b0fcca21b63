"""A unit test starts no process: it checks pure logic on data it makes.  A test here that forks,
spawns or runs a command fails with a line saying where such a test belongs."""

from __future__ import annotations

import os
import subprocess

import pytest


def _refuse(*args, **kwargs):
    raise AssertionError("a unit test starts no process: move this test to tests/process (a fresh interpreter, "
                         "the CLI, a sleeper) or tests/ddp (real ranks)")


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse)
