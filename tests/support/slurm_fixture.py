"""Session fixture `slurm_cluster`: a real SLURM cluster (tests/support/slurm_cluster.py) for the whole test session.

Use it from tests/conftest.py with `pytest_plugins = ["tests.support.slurm_fixture"]`
(or `from tests.support.slurm_fixture import slurm_cluster  # noqa`).
Where no cluster can run, its tests are skipped; with CI=true they fail instead, since CI must run them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .slurm_cluster import SlurmCluster, Unavailable, shared


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
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but no SLURM test cluster can start here: {exc}", pytrace=False)
        pytest.skip(f"no SLURM test cluster: {exc}")
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
