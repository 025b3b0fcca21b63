"""A warm pool checks a task factory against task.options like a cold submit: a factory that cannot
take them is one ConfigError line before the job reaches a rank, no run folder is made, and the
pool serves the next job."""

from __future__ import annotations

import pytest

import workbench
from tests.support.lifecycle import assert_nothing_left, cfg
from workbench.errors import ConfigError

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]


def needs_width(width, depth=2):
    raise AssertionError("never called: the options do not bind")


def test_pool_submit_binds_the_factory_before_the_job_reaches_a_rank(tmp_path):
    job = cfg(tmp_path, max_steps=4, checkpoint_every_steps=None)
    with workbench.Pool(job, idle_timeout_s=300) as pool:
        with pytest.raises(ConfigError) as caught:
            pool.submit(job, task=needs_width)
        assert caught.value.problems[0].startswith("task.options: needs_width() needs width, and the config's "
                                                   "task.options (n_train, n_val) are for the built-in task synthetic")
        root = tmp_path / "runs"
        assert [p.name for p in root.iterdir()] == ["pools"], "a run folder was made for a refused job"
        status = pool.submit(job).wait(timeout=180)
        assert status.state == "finished", status
    assert_nothing_left(pool.dir.root)
