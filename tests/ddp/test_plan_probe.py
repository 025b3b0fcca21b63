"""The plan's link probe (workbench.planning.probe): real gloo ranks on this host measure a collective's
latency and bandwidth and the engine's own work a step; the result is cached, the ranks are ended on
every path.  A CPU plan's step probe: the model's own engine step with its ranks stepping at once.  No
figure is asserted beyond its sign: the machine is shared."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import workbench
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


def _ms(notes: list[str], start: str) -> float:
    """The figure in ms, in seconds, that follows `start` in the note that starts with it: "... (12.3 ms"."""
    note = next(n for n in notes if n.startswith(start))
    return float(note[len(start):].split("(", 1)[1].split(" ms")[0]) / 1000


def test_a_cpu_plan_measures_the_models_step_with_its_ranks_at_once_and_models_only_beyond_the_host(
        tmp_path, monkeypatch):
    """Up to a node's ranks the row is the engine's step of the model measured with that many ranks at once
    (they share the host's cores as the run's will); beyond, their compute plus the link's collectives.  A
    factory that fails in the ranks leaves the model of the step, said why, and no process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options = {"dim": 16, "hidden": 32, "classes": 4, "n_train": 1024, "n_val": 8}
    cfg = JobConfig.from_dict({"task": {"name": "synthetic", "options": options}, "train": {"micro_batch_size": 8},
                               "dist": {"procs_per_node": 2, "threads_per_rank": 1}})
    before = _children()
    frame = workbench.plan(cfg, world_sizes=(2, 4)).set_index("world_size")
    notes = frame.attrs["notes"]
    assert frame.loc[2, "step_s"] == pytest.approx(_ms(notes, "step time at 2 ranks (ddp): the engine's step of this "
                                                              "model measured with 2 ranks stepping at once"), abs=1e-4)
    bare = _ms(notes, "step time beyond 2 ranks: the micro-batch's compute with 2 ranks stepping at once")
    assert frame.loc[4, "step_s"] > bare > 0 and not _children() - before

    failing = cfg.replace(task__name="tests.support.tasks_for_tests:only_outside_ranks")
    frame = workbench.plan(failing, world_sizes=(2,))
    notes = frame.attrs["notes"]
    said = "step time at 2 ranks (ddp): not measured with its ranks at once (RuntimeError: the step probe of "
    assert any(n.startswith(said) and "at 2 ranks wrote nothing: ValueError: cannot build" in n for n in notes), notes
    assert frame["step_s"].iloc[0] > 0 and any(n.startswith("step time: one micro-batch measured") for n in notes)
    assert not _children() - before
