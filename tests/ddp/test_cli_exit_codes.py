"""The CLI's exit codes on a real failed run (2 gloo ranks): `workbench show` did its job (exit 0)
and names the failure; `workbench follow` of the failed run exits 1, as the command that ran it
did; a folder that is not a run is one `workbench:` line and exit 2."""

from __future__ import annotations

import subprocess

import pytest

import workbench
from tests.support.lifecycle import CLI, assert_nothing_left, cfg

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]


def _raise_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one gives up")
    dist.barrier()  # all ranks must reach this: rank 0 waits for the rank that raised


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_show_exits_0_for_a_failed_run_and_follow_exits_1(tmp_path):
    run = workbench.submit_fn(_raise_on_rank_one, cfg=cfg(tmp_path))
    assert run.wait(timeout=180).state == "failed"
    shown = _cli("show", str(run.folder))
    assert shown.returncode == 0, shown
    assert "rank 1" in shown.stderr and "ValueError: rank one gives up" in shown.stderr, shown.stderr
    followed = _cli("follow", str(run.folder))
    assert followed.returncode == 1, followed
    missing = _cli("show", str(tmp_path / "no-such-run"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing
    assert missing.stderr.startswith("workbench: ") and "no-such-run" in missing.stderr
    assert "exit status: 0 the command did what it was asked" in " ".join(_cli("--help").stdout.split())
    assert_nothing_left(run.folder)
