"""A three-member etcd cluster on loopback for the HA tests (``rigs.etcd``), one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rigs.etcd import EtcdCluster, running_cluster


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Three members, started once per module by ``.ci/etcd-cluster start``."""
    with running_cluster(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest.fixture
def etcd_endpoints(etcd_cluster: EtcdCluster) -> tuple[str, ...]:
    return etcd_cluster.endpoints
