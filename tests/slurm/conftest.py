"""The Slurm tests run against a real cluster started by ``.ci/slurm-up.sh`` (one per test session,
``rigs.slurm``). Without the Slurm binaries the tests are skipped, except in CI (``CI=true``), where that is a
failure (``rigs.backends``; ``make test-integration`` installs them). A cluster that does not come up is always a
failure. At the end of the session every job is cancelled, the daemons are stopped, and any process still
mentioning the cluster's directory is killed (by pid) and reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rigs.plugin import Persistent
from rigs.slurm import SlurmTestCluster, persistent, plugin_config, running_cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmTestCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def clean_cluster(slurm: SlurmTestCluster) -> Iterator[SlurmTestCluster]:
    """The cluster with no job live before and after the test (the nodes are free for the next one)."""
    slurm.cancel_everything()
    yield slurm
    slurm.cancel_everything()


@pytest.fixture
def plugin(clean_cluster: SlurmTestCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Persistent]:
    """The plugin over its persistent transport, with the default test configuration and a cluster tag unique to
    this test (the one-shot transport has its own tests and the conformance kit runs both)."""
    client = persistent(tmp_path, plugin_config(clean_cluster), f"t-{request.node.name}"[:60])
    yield client
    client.close()
