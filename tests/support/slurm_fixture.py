"""Session fixture `slurm_cluster`: a real SLURM cluster (tests/support/slurm_cluster.py) for the whole test session.

Use it from tests/conftest.py with `pytest_plugins = ["tests.support.slurm_fixture"]`
(or `from tests.support.slurm_fixture import slurm_cluster  # noqa`).
Where no cluster can run, its tests are skipped; with CI=true they fail instead, since CI must run them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from .slurm_cluster import SlurmCluster, Unavailable, ensure_packages, shared


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def slurm_clients() -> None:
    """SLURM's commands (sbatch, squeue, sacct, scancel, srun) on PATH, installed with the cluster's packages
    where they are missing, for tests that run them against a controller that does not answer.  A `skipif` on
    `shutil.which` would skip these tests on a fresh machine: collection comes before any fixture installs."""
    why = ensure_packages() if sys.platform.startswith("linux") else "SLURM's commands are Linux packages"
    if why:
        _unavailable(f"no SLURM commands here: {why}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The machine's one cluster, shared by every worker of the session (started by the first to ask, stopped
    by the last to finish); each test that uses it holds the "slurm" lock (tests/conftest.py)."""
    saved_env = {name: os.environ.get(name) for name in SlurmCluster().env}
    try:
        with shared() as cluster:  # may apt-get install the packages
            os.environ.update(cluster.env)
            yield cluster
    except Unavailable as exc:
        _unavailable(f"no SLURM test cluster can start here: {exc}")
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
