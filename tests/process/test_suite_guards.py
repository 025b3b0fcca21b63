"""The suite's own guards, on real pytest sessions: what the machine has once (the SLURM test cluster, the
checkout's runs/ folders, JupyterLab) is never used by two tests at once, whatever the scheduler.

Each test runs a small suite in a fresh `python -m pytest` whose tests record when they ran and on which
worker: two modules that hold "checkout" the way tests/conftest.py marks tests/notebooks, and one that
holds nothing; or modules that hold "slurm", as tests/slurm does, and both, as a notebook that uses the
SLURM test cluster does.  Its lock folder is the test's own (WB_TEST_LOCK_DIR), so a real suite
running beside it is not touched."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib

pytestmark = pytest.mark.timeout(180)

ADDOPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
"""The scheduler settings the suite runs with (`-n 3 --dist loadgroup`)."""

HOLDING = '''
import json, os, time
import pytest

pytestmark = [pytest.mark.holds(*HELD), pytest.mark.xdist_group(HELD[0])]


@pytest.fixture(scope="module")
def shared_state():  # like a module's SLURM job or notebook folder: only the lock's holder may see it
    yield {}


@pytest.mark.parametrize("i", range(3))
def test_held(i, shared_state):
    start = time.monotonic()
    time.sleep(0.3)
    with open(os.environ["RECORD"], "a") as out:
        out.write(json.dumps({"test": __name__ + str(i), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                              "held": HELD, "start": start, "end": time.monotonic()}) + "\\n")
'''

FREE = '''
import pytest


@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
'''


def _run_suite(folder: Path, options: str, held: tuple[tuple[str, ...], ...] = (("checkout",), ("checkout",)),
               ) -> list[dict]:
    modules = {f"test_held_{i}.py": f"HELD = {names!r}\n" + HOLDING for i, names in enumerate(held)}
    for name, text in {**modules, "test_free.py": FREE,
                       "conftest.py": 'pytest_plugins = ["tests.support.exclusive"]\n'}.items():
        (folder / name).write_text(text)
    (folder / "pytest.ini").write_text("[pytest]\n")  # this folder is the rootdir: none of the project's settings
    record = folder / "record.jsonl"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "WB_TEST_"))}
    env |= {"PYTHONPATH": str(REPO), "RECORD": str(record), "WB_TEST_LOCK_DIR": str(folder / "locks")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *shlex.split(options)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def _overlaps(records: list[dict]) -> list[tuple[str, str]]:
    """Pairs of tests that ran at the same time and hold a resource in common."""
    return [(a["test"] + "@" + a["worker"], b["test"] + "@" + b["worker"])
            for i, a in enumerate(records) for b in records[i + 1:]
            if set(a["held"]) & set(b["held"]) and a["start"] < b["end"] and b["start"] < a["end"]]


def test_the_suites_scheduler_keeps_a_group_on_one_worker(tmp_path):
    """Fails when pytest/xdist stop honouring `xdist_group` under the suite's addopts (pytest 9.2 with xdist 3.8
    does): the suite stays right (the lock), but its shared tests would then wait on each other across workers."""
    records = _run_suite(tmp_path, ADDOPTS)
    assert len(records) == 6
    workers = {r["worker"] for r in records}
    assert len(workers) == 1, f"the 'checkout' group ran on workers {sorted(workers)}: grouping is broken"


def test_tests_holding_the_checkout_never_overlap_under_any_scheduler(tmp_path):
    """`--dist each` runs every test on both workers at once: the worst case for the lock.  Each worker's held
    tests run as one block (its module fixtures live inside the hold), never beside the other's."""
    records = _run_suite(tmp_path, "-n 2 --dist each")
    assert len(records) == 12 and {r["worker"] for r in records} == {"gw0", "gw1"}
    assert _overlaps(records) == []
    ordered = sorted(records, key=lambda r: r["start"])
    switches = sum(a["worker"] != b["worker"] for a, b in zip(ordered, ordered[1:]))
    assert switches == 1, f"the lock changed hands {switches} times: {[r['worker'] for r in ordered]}"


def test_serially_the_lock_is_taken_and_given_back(tmp_path):
    records = _run_suite(tmp_path, "-p no:xdist")
    assert len(records) == 6 and _overlaps(records) == []


@pytest.mark.parametrize("options", [ADDOPTS, "-n 2 --dist each"])
def test_a_test_holding_two_resources_waits_for_both_and_none_waits_forever(tmp_path, options):
    """A notebook that uses the SLURM test cluster holds "checkout" and "slurm"; tests/slurm hold "slurm" alone,
    in the other group (another worker): the SLURM tests never overlap the notebook, the other notebooks may, and
    the locks, taken in one order, never leave two workers waiting on each other."""
    records = _run_suite(tmp_path, options, held=(("checkout",), ("checkout", "slurm"), ("slurm",)))
    assert len(records) == 9 * (2 if "each" in options else 1)
    assert _overlaps(records) == []


def test_the_slurm_test_clusters_owner_leaving_first_hands_it_to_the_last_user(tmp_path, monkeypatch):
    """Two workers share the cluster (group slurm, and notebook 03 in group checkout).  When its starter (the
    owner) leaves first, the one still using it becomes the owner, so that the last to leave stops it: an
    owner counted as a user after it left kept the whole cluster running after a suite (seen once: every
    daemon left running, its state naming only the dead owner)."""
    from tests.support import slurm_cluster as sc

    monkeypatch.setattr(sc, "STATE_DIR", tmp_path)
    monkeypatch.setattr(sc, "STATE_FILE", tmp_path / "pids")
    monkeypatch.setattr(sc, "STATE_LOCK", tmp_path / "lock")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the worker still using it
    try:
        them = {"pid": other.pid, "start": sc._proc_stat(other.pid)[1]}
        me = sc._me()
        sc._save_state({"owner": me, "users": [me, them], "daemons": [], "nodes": ["n1", "n2"],
                        "workdir": str(tmp_path / "cluster"), "ports": {}})
        with sc.shared():  # this process, the owner, joins and then leaves first
            pass
        state = sc._load_state()
        assert state["owner"] == them and state["users"] == [them]
        other.kill()
        other.wait()
        assert sc._live_users(state) == []  # the other gone too: no one is counted as using it
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


SHOW_GROUPS = """
def pytest_collection_finish(session):
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        print("GROUP", mark.args[0] if mark else "-", item.nodeid)
"""


def test_a_test_holding_two_resources_runs_last_in_the_slurm_group(tmp_path):
    """Notebook 03 (checkout and slurm) runs after every SLURM test, on their worker: earlier, one worker
    would wait for the other's SLURM group or checkout group with nothing to do (tests/conftest.py, _holds_two)."""
    (tmp_path / "show_groups.py").write_text(SHOW_GROUPS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "-p", "show_groups", "tests/notebooks", "tests/slurm/test_slurm_cluster.py"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    groups = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("GROUP ")]
    assert groups[-1] == ["slurm", "tests/notebooks/test_notebooks.py::test_notebook_runs[03_slurm]"], groups
    assert {group for group, test in groups[:-1]} == {"checkout", "slurm"} and len(groups) > 12, groups
    assert all((group == "slurm") == test.startswith("tests/slurm/") for group, test in groups[:-1]), groups
