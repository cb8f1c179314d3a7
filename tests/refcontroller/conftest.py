from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from refcontroller.cluster import Cluster
from refcontroller.store import FactStore

# The tests share small builders (rc_factories.py); importlib mode does not put this folder on sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))

TTL = 30.0
CHECK = 5.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FactStore]:
    s = FactStore.open(tmp_path / "facts.sqlite")
    yield s
    s.close()


@pytest.fixture
def cluster(store: FactStore) -> Cluster:
    """Three replicas, primary 0 in term 1, promoted at t=0 (so the grace runs until t=35)."""
    return Cluster.open(store, replica_count=3, ttl=TTL, check_interval=CHECK, now=0.0)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster CA and role certificates (controller valid for localhost/127.0.0.1/::1)."""
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, "testcluster")
    return directory


@pytest.fixture(scope="session")
def foreign_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another CA with the same cluster name: its certificates must not be accepted."""
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("foreign")
    init_certs(directory, "testcluster")
    return directory
