"""A three-member etcd cluster on loopback (``.ci/etcd-cluster``) and reference-controller replicas on it, as
processes (issue 22: the replicas elect their primary through etcd).

``running_cluster`` is the fixture's body: the binary found, or built once from Go modules and cached (only with
``PROVISIONERD_ETCD_SKIP=1`` do the etcd tests skip instead), three members started, and stopped at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from provisionerd.config.loader import Backoff, Config, ProviderConfig
from rigs import backends, controller, procs, wait
from rigs.daemon import daemon_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "etcd-cluster"
#: A daemon's link to replicas that fail over: 0.3 s heartbeats and a 1.5 s heartbeat timeout, so that a lost
#: primary shows within the replicas' lease TTL of a few seconds.
FAILOVER_LINK = dict(
    connect_timeout=2, request_timeout=2, heartbeat_interval=0.3, heartbeat_timeout=1.5, backoff=Backoff(0.1, max=0.5)
)


@attrs.frozen
class EtcdCluster:
    endpoints: tuple[str, ...]  # the three members' client URLs (http://127.0.0.1:PORT), member i at index i
    work: Path

    def pids(self) -> list[int]:
        return [int((self.work / f"m{i}.pid").read_text()) for i in range(len(self.endpoints))]

    async def replace(self, member: int) -> tuple[str, str]:
        """``.ci/etcd-cluster replace``: member ``member`` is killed, loses its data dir and rejoins as a new member
        (``member remove``, ``member add``, an empty data dir); its (old, new) member IDs."""
        done = await procs.run_async([SCRIPT, "replace", self.work, str(member)])
        assert done.returncode == 0, f".ci/etcd-cluster replace failed:\n{done.stderr[-4000:]}"
        old, new = done.stdout.split()
        return old, new

    @property
    def store(self) -> str:
        """The ``--store`` URL of a replica on this cluster."""
        return store_url(self.endpoints)


def store_url(endpoints: Sequence[str]) -> str:
    return "etcd://" + ",".join(e.removeprefix("http://") for e in endpoints)


@contextmanager
def running_cluster(work: Path) -> Iterator[EtcdCluster]:
    """Three members with their data under ``work``, stopped at the end."""
    if procs.run([SCRIPT, "path"]).returncode != 0:
        if os.environ.get("PROVISIONERD_ETCD_SKIP") == "1":
            backends.missing("no etcd binary and PROVISIONERD_ETCD_SKIP=1")
        built = procs.run([SCRIPT, "build"], timeout=3600)
        assert built.returncode == 0, f".ci/etcd-cluster build failed:\n{built.stderr[-4000:]}"
    started = procs.run([SCRIPT, "start", work], timeout=60)
    assert started.returncode == 0, f".ci/etcd-cluster start failed:\n{started.stderr[-4000:]}"
    try:
        env = dict(line.split("=", 1) for line in (work / "env").read_text().splitlines() if "=" in line)
        yield EtcdCluster(tuple(env["ETCD_ENDPOINTS"].split(",")), work)
    finally:
        procs.run([SCRIPT, "stop", work], timeout=60)


async def start_replica(
    started: procs.Procs,
    certs: Path,
    store: str,
    log: Path,
    *,
    ttl: float,
    check: float,
    listen: str = "127.0.0.1:0",
) -> tuple[procs.Proc, str]:
    """One ``refcontroller serve --store etcd://...`` process (a 5 s heartbeat timeout, a 2 s claim on etcd):
    the process and its address, once ready."""
    args = ["--certs", certs, "--store", store, "--listen", listen, "--lease-ttl", str(ttl)]
    args += ["--check-interval", str(check), "--heartbeat-timeout", "5", "--etcd-lease-ttl", "2"]
    proc, address, ready = await controller.start(started, log.stem, args, log)
    assert ready["store"] == "etcd", ready
    return proc, address


async def wait_primary(admin: Any, limit: float = 20.0, what: str = "a primary replica (term >= 1)") -> dict[str, Any]:
    """The status of the replicas ``admin`` reaches, once one of them is primary (``refcontroller.admin``'s
    ``AdminClient``: errors while none answers are waited through)."""
    from refcontroller.admin import AdminError

    async def probe() -> dict[str, Any] | None:
        try:
            status = await admin.status()
        except (AdminError, OSError):
            return None
        return status if status["term"] >= 1 else None

    return await wait.until(what, probe, limit, interval=0.1)


def failover_config(
    certs: Path, addresses: Sequence[str], state: Path, provider: ProviderConfig, identity: str = "prov-ha"
) -> Config:
    """A daemon config for replicas that fail over (``FAILOVER_LINK``), its state in ``state`` (made here)."""
    state.mkdir(parents=True, exist_ok=True)
    return daemon_config(certs, addresses, state, provider, identity=identity, link=FAILOVER_LINK)
