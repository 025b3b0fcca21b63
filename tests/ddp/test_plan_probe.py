"""The plan's link probe (workbench.planning.probe): real gloo ranks on this host measure a collective's
latency and bandwidth and the engine's own work a step; the result is cached, the ranks are ended on
every path.  No figure is asserted beyond its sign: the machine is shared."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from workbench.config import JobConfig
from workbench.planning import probe
from workbench.planning.probe import cache_path, measured_link, probe_settings

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]


def _children() -> set[int]:
    """This process's children now: compared with those it had before the probe (other tests of the
    session may keep theirs alive: a warm pool, JupyterLab), so only the probe's own count."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found |= {int(pid) for pid in (task / "children").read_text().split()}
    return found


def test_the_probe_measures_a_link_at_two_ranks_once_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = JobConfig.from_dict({"dist": {"procs_per_node": 2, "threads_per_rank": 1}})
    settings = probe_settings(cfg, 1)
    before = _children()
    link = measured_link(2, settings)
    assert link.world_size == 2 and link.latency_s > 0 and link.bus_gbps > 0 and link.overhead_s >= 0
    assert link.source.startswith("measured ") and cache_path() == tmp_path / "workbench" / "links.json"
    assert cache_path().is_file() and not _children() - before

    def no_process(*args, **kwargs):
        raise AssertionError("a cached link started a process")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert measured_link(2, settings) == link  # from the cache


def test_a_probe_whose_ranks_fail_says_why_at_once_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "TIMEOUT_S", 120.0)
    settings = {"threads": 1, "train": {"no_such_field": 1}, "dist": {"strategy": "ddp"}}
    before = _children()
    with pytest.raises(RuntimeError, match="the link probe at 2 ranks wrote nothing: .*no_such_field"):
        measured_link(2, settings)
    assert not _children() - before and not cache_path().exists()
