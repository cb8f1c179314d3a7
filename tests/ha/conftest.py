"""A three-member etcd cluster on loopback for the HA tests (``.ci/etcd-cluster``), one per test module.

The binary is found (or built once, from Go modules, and cached) by ``.ci/etcd-cluster build``; only with
``PROVISIONERD_ETCD_SKIP=1`` do the etcd tests skip instead of building it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from rigs import backends

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "etcd-cluster"


@attrs.frozen
class EtcdCluster:
    endpoints: tuple[str, ...]  # the three members' client URLs (http://127.0.0.1:PORT), member i at index i
    work: Path

    def pids(self) -> list[int]:
        return [int((self.work / f"m{i}.pid").read_text()) for i in range(len(self.endpoints))]

    def replace_command(self, member: int) -> list[str]:
        """``.ci/etcd-cluster replace``: member ``member`` loses its data dir and rejoins as a new member."""
        return [str(SCRIPT), "replace", str(self.work), str(member)]


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Three members, started once per module by ``.ci/etcd-cluster start``."""
    if subprocess.run([SCRIPT, "path"], capture_output=True).returncode != 0:
        if os.environ.get("PROVISIONERD_ETCD_SKIP") == "1":
            backends.missing("no etcd binary and PROVISIONERD_ETCD_SKIP=1")
        subprocess.run([SCRIPT, "build"], check=True, capture_output=True)
    work = tmp_path_factory.mktemp("etcd")
    subprocess.run([SCRIPT, "start", work], check=True, capture_output=True, timeout=60)
    try:
        env = dict(line.split("=", 1) for line in (work / "env").read_text().splitlines() if "=" in line)
        yield EtcdCluster(tuple(env["ETCD_ENDPOINTS"].split(",")), work)
    finally:
        subprocess.run([SCRIPT, "stop", work], check=False, capture_output=True, timeout=60)


@pytest.fixture
def etcd_endpoints(etcd_cluster: EtcdCluster) -> tuple[str, ...]:
    return etcd_cluster.endpoints
