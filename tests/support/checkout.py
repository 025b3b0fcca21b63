"""What a user's fresh clone has: their environment (no WORKBENCH_* variable a test might set) and
what `git status` shows, so a test can say that running the README, a docs/ page or a notebook in place left
nothing git sees."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from . import REPO

SOURCES = ("workbench/", "tests/", "bench/")
"""Where developers add and change files while a test runs in a shared checkout; no block of the README or
docs/ and no notebook writes there, so git status is compared outside them."""


def user_env() -> dict[str, str]:
    """The environment of a user's shell or kernel: no WORKBENCH_* variable; matplotlib's backend is
    the kernel's own (inline), as in JupyterLab."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")}
    env.pop("MPLBACKEND", None)
    return env


def git_status() -> set[str]:
    """`git status --porcelain` lines (untracked files one by one), outside SOURCES."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)
    return {line for line in out.stdout.splitlines() if not line[3:].lstrip('"').startswith(SOURCES)}


def run_folders(root: Path) -> set[Path]:
    """The run folders and pool folders under a run root."""
    pools = root / "pools"
    found = set(root.iterdir()) if root.is_dir() else set()
    return (found - {pools}) | (set(pools.iterdir()) if pools.is_dir() else set())


def remove_runs(folders: set[Path]) -> None:
    """Remove run and pool folders a test made in place; a run or pool still going (a block failed
    before it ended: runs outlive the kernel) is cancelled or closed first, so nothing writes there after."""
    import contextlib
    import shutil

    from workbench.launch.pool import close_pool
    from workbench.launch.run import Run

    for folder in folders:
        with contextlib.suppress(Exception):  # a half-made folder is removed all the same
            close_pool(folder) if folder.parent.name == "pools" else Run.load(folder).cancel()
        shutil.rmtree(folder, ignore_errors=True)
