"""Fixtures more than one test file uses, defined once (tests/conftest.py loads this as a plugin)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A real small tmpfs at `path` (a filesystem that fills up, or is read-only with "ro"); mounting
    needs root, so the test is skipped where it cannot be mounted."""
    path.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join((f"size={size}", *options)), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MB tmpfs: checkpoints of a few MB each fill it."""
    with tmpfs(tmp_path / "small", "40m") as mount:
        yield mount


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """A real one-rank gloo process group in this process (no process is started: a file store)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local 2-rank gloo pool (1 thread a rank) for the session's pool tests, warmed once: a job
    that fails or is cancelled leaves the pool serving the next with fresh workers, which is what
    those tests show.  Nothing of it is left after close()."""
    import workbench
    from tests.support.lifecycle import assert_nothing_left, cfg

    root = tmp_path_factory.mktemp("pool")
    # idle for up to an hour: other tests may run between the pool tests of one worker
    warm = workbench.Pool(cfg(root, max_steps=12, checkpoint_every_steps=None), idle_timeout_s=3600).wait_ready(180)
    yield warm
    warm.close()
    assert_nothing_left(warm.dir.root)
