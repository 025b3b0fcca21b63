"""The rendezvous store of a local run or pool listens on loopback alone (issue 30, item 4): the
store is unauthenticated, and torch's env:// rendezvous has rank 0 listen on every interface.
Each shape that makes the group: the engine, a script's own init_process_group(), a warm pool."""

from __future__ import annotations

import ast
import json

import pytest

import workbench
from tests.support import SCRIPTS
from tests.support.lifecycle import assert_nothing_left, cfg

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]
LOOPBACK = {"127.0.0.1", "::1"}


def test_a_local_runs_store_listens_on_loopback_alone(tmp_path):
    note = tmp_path / "listeners.json"
    run = workbench.submit(cfg(tmp_path, "tests.support.tasks_for_tests:noting_listeners", {"note": str(note)},
                               max_steps=3, checkpoint_every_steps=None))
    assert run.wait(timeout=180).state == "finished", run.exception()
    listeners = json.loads(note.read_text())
    assert listeners and set(listeners) <= LOOPBACK, f"the store listens on {listeners}"
    assert_nothing_left(run.folder)


def test_a_scripts_own_init_process_group_meets_on_loopback_alone(tmp_path):
    note = tmp_path / "listeners.json"
    run = workbench.submit_script(SCRIPTS / "store_listeners.py", [str(note)], cfg(tmp_path))
    assert run.wait(timeout=180).state == "finished", run.exception()
    listeners = json.loads(note.read_text())
    assert listeners and set(listeners) <= LOOPBACK, f"the store listens on {listeners}"


def test_a_local_pools_store_listens_on_loopback_alone(tmp_path):
    with workbench.Pool(cfg(tmp_path), idle_timeout_s=300).wait_ready(180) as pool:
        outcomes = pool.run_cell("import os\nfrom tests.support.net import listening\n"
                                 "listening(int(os.environ['MASTER_PORT']))", timeout_s=60)
        listeners = ast.literal_eval(outcomes[0]["result"])
        assert listeners and set(listeners) <= LOOPBACK, f"the pool's store listens on {listeners}"
    assert_nothing_left(pool.dir.root)
