"""Session fixture `slurm_cluster`: a real SLURM cluster (tests/support/slurm_cluster.py) for the whole test session.

Use it from tests/conftest.py with `pytest_plugins = ["tests.support.slurm_fixture"]`
(or `from tests.support.slurm_fixture import slurm_cluster  # noqa`).
Where no cluster can run, its tests are skipped; with CI=true they fail instead, since CI must run them.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from .slurm_cluster import SlurmCluster, skip_reason


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = skip_reason()  # may apt-get install the packages
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but no SLURM test cluster can start here: {reason}", pytrace=False)
        pytest.skip(f"no SLURM test cluster: {reason}")
    cluster = SlurmCluster()
    saved_env = {name: os.environ.get(name) for name in cluster.env}
    cluster.start()
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cluster.stop()
