"""``refcontroller serve --store etcd://HOST:PORT[,...] --listen ADDR``: one replica process on etcd (issue 22).

Several such processes, each with its own ``--listen`` address, against one etcd cluster are the controller's
replicas. Each listens at once and loops:

- **standby**: it campaigns every ``check_interval / 2`` (``election_etcd``); meanwhile every join is answered with
  a redirect to the primary etcd names (``Claim.address``; an empty redirect while there is none: the client
  rotates through its addresses);
- **primary**: once a campaign wins, the store is replayed from etcd (``store_etcd``), a new lease table is
  promoted now (its grace covers the previous primary's leases) and ``replica_etcd.keep_primary`` keeps the claim
  confirmed; when the claim is lost or a write is refused (deposed), every connection is dropped (the daemons rejoin
  and are redirected), the mirror is discarded and the replica is a standby again.

SIGTERM resigns the claim (another replica is elected at its next campaign, within ``check_interval / 2``); kill -9
leaves it to expire with its etcd lease (``--etcd-lease-ttl``, default 2 s).
"""

from __future__ import annotations

import functools
import logging
import secrets

import attrs
import trio

from refcontroller.cluster import Cluster
from refcontroller.election_etcd import Claim, EtcdElection
from refcontroller.gate import Gate, return_memory
from refcontroller.leases import LeaseTable
from refcontroller.listeners import Running, ServeConfig, _close_all, open_replica_listeners
from refcontroller.replica_etcd import keep_primary, promote_stepped
from refcontroller.replicas import ReplicaSet
from refcontroller.server import ControllerServer, open_controller_server
from refcontroller.store import FactStore
from refcontroller.store_etcd_client import EtcdClient, EtcdError

log = logging.getLogger(__name__)


@attrs.frozen
class EtcdServeConfig:
    serve: ServeConfig  # listen: exactly one address
    endpoints: tuple[str, ...]
    prefix: bytes = b"provisionerd/"
    etcd_lease_ttl: int = 2
    etcd_timeout: float = 0.5


def standby_cluster(address: str, primary: Claim | None, ttl: float, check: float, now: float) -> Cluster:
    """What a standby answers with: not the primary (replica 0 is us, 1 the primary etcd names), nothing stored."""
    store = FactStore.open(":memory:")
    replicas = ReplicaSet(
        count=2, term=primary.term if primary else 0, primary=1, promoted_at=now, save_term=store.save_term
    )
    replicas.addresses = [address, primary.address if primary else ""]
    return Cluster(store, replicas, LeaseTable(max(replicas.term, 1), now, ttl, check), ttl, check, store.load_demand())


async def serve_etcd(
    config: EtcdServeConfig, *, task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run one replica until cancelled; ``Running`` once it listens (primary or not)."""
    s = config.serve
    if len(s.listen) != 1:
        raise ValueError(f"an etcd replica listens on one address, not {len(s.listen)}: run one process each")
    per_replica, actual = await open_replica_listeners(s.listen, s.certs_dir)
    address = actual[0]
    store_client = EtcdClient(config.endpoints, config.etcd_timeout)
    election = EtcdElection(
        EtcdClient(config.endpoints, config.etcd_timeout),
        f"{address}#{secrets.token_hex(4)}",
        address,
        config.prefix,
        config.etcd_lease_ttl,
    )
    try:
        cluster = standby_cluster(address, None, s.lease_ttl, s.check_interval, trio.current_time())
        options = {"timeouts": s.timeouts, "max_frame": s.max_frame, "gate": Gate(s.limits)}
        async with open_controller_server(cluster, **options) as server, trio.open_nursery() as nursery:
            nursery.start_soon(return_memory, server.gate)
            nursery.start_soon(trio.serve_listeners, functools.partial(server.handle_stream, replica=0), per_replica[0])
            task_status.started(Running((address,), server))
            try:
                await _replica_loop(server, election, store_client, config)
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(election.resign)
    finally:
        await _close_all(per_replica)
        store_client.close()
        election.client.close()


def _install(server: ControllerServer, cluster: Cluster) -> None:
    old = server.cluster
    server.cluster = cluster
    server.disconnect_replica(0)  # everyone rejoins: to the new primary, or redirected to it
    old.store.close()


async def _replica_loop(
    server: ControllerServer, election: EtcdElection, store_client: EtcdClient, config: EtcdServeConfig
) -> None:
    s = config.serve
    address = server.cluster.replicas.address_of(0)
    while True:
        # Standby: campaign; between attempts, redirect to whoever etcd says is primary.
        claim: Claim | None = None
        known: Claim | None = None
        while claim is None:
            try:
                claim = await trio.to_thread.run_sync(election.campaign)
                current = None if claim else await trio.to_thread.run_sync(election.current)
            except EtcdError as exc:
                log.warning("campaign: %s", exc)
                current = None
            if claim is None and current != known:
                known = current
                log.info("standby: primary is %s", current.address if current else "unknown")
                _install(server, standby_cluster(address, current, s.lease_ttl, s.check_interval, trio.current_time()))
            if claim is None:
                await trio.sleep(s.check_interval / 2)
        won_at = trio.current_time()
        try:  # the mirror's SQLite connection belongs to the event loop: replayed there, in steps
            cluster = await promote_stepped(store_client, election, claim, s.lease_ttl, s.check_interval, won_at)
        except EtcdError as exc:
            log.warning("elected in term %d but the log could not be replayed: %s; resigning", claim.term, exc)
            await trio.to_thread.run_sync(election.resign)
            continue
        _install(server, cluster)
        log.info(
            "primary term=%d incarnation=%s facts=%d listen=%s",
            cluster.term,
            cluster.store.incarnation,
            cluster.store.count(),
            address,
        )
        reason = await keep_primary(cluster, election, s.check_interval)
        log.warning("stepping down from term %d: %s", cluster.term, reason)
        await trio.to_thread.run_sync(election.resign)
        _install(server, standby_cluster(address, None, s.lease_ttl, s.check_interval, trio.current_time()))
