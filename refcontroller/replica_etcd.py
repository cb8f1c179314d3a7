"""One replica of the reference controller on etcd: once elected, a ``Cluster`` over the replayed store, kept
primary by a confirming loop (issue 22 items 1-2; ``election_etcd`` and ``store_etcd`` say the rules).

``promote(...)`` builds the primary's ``Cluster`` after a won campaign: the store replayed from etcd's log, the term
the election wrote, a new (empty) lease table promoted *now*, so its grace (``leases.LeaseTable``) covers whatever
lease the previous primary granted: only each provider's durable last grantee is re-granted before it ends.

``keep_primary`` runs while the replica is primary: every ``check_interval / 3`` it refreshes the etcd lease and
reads the claim back through a majority (``EtcdElection.confirm``). ``replicas.quorum_fresh`` is true only while
the last confirming request was *sent* less than ``check_interval`` ago, so a grant or renewal always rests on a
linearizable read within ``T_check``; a lost claim (or a write etcd refused: ``store.deposed``) ends it: the
quorum is marked lost at once and ``keep_primary`` returns, and the caller steps down.
"""

from __future__ import annotations

import logging

import trio

from refcontroller.cluster import Cluster
from refcontroller.election_etcd import Claim, EtcdElection
from refcontroller.leases import LeaseTable
from refcontroller.replicas import ReplicaSet
from refcontroller.store_etcd import EtcdFactStore
from refcontroller.store_etcd_client import EtcdClient, EtcdError

log = logging.getLogger(__name__)


class EtcdReplicaSet(ReplicaSet):
    """The one replica of this process, primary in ``term``. ``quorum_fresh`` is computed on trio's clock at each
    read: true only before ``fresh_until`` (the last confirming request's send time + ``T_check``), so a primary
    that was stopped and wakes up finds it false before it answers anything (no flag left over from before)."""

    fresh_until: float = float("-inf")
    _switch: bool = True
    #: The store whose writes this primary makes: one that was deposed (a write etcd refused) ends the quorum at once.
    store: EtcdFactStore | None = None

    @property
    def quorum_fresh(self) -> bool:
        deposed = self.store is not None and bool(self.store.deposed)
        return self._switch and not deposed and trio.current_time() < self.fresh_until

    @quorum_fresh.setter
    def quorum_fresh(self, value: bool) -> None:  # ReplicaSet.set_quorum (and its __init__): the admin's switch
        self._switch = value

    def lose(self) -> None:
        self.fresh_until = float("-inf")


def promote(
    client: EtcdClient,
    election: EtcdElection,
    claim: Claim,
    ttl: float,
    check_interval: float,
    now: float,
) -> Cluster:
    """The primary's ``Cluster`` after ``election`` won ``claim`` (blocking: replays the log). Its quorum is fresh
    for ``check_interval`` from ``now`` (the campaign's transaction went through a majority just before)."""
    return primary_cluster(EtcdFactStore.replay(client, election, election.prefix), claim, ttl, check_interval, now)


async def promote_stepped(
    client: EtcdClient, election: EtcdElection, claim: Claim, ttl: float, check_interval: float, now: float
) -> Cluster:
    """``promote`` on the event loop: the log replayed in steps (``EtcdFactStore.replay_stepped``), so the replica
    keeps answering (redirects, heartbeats) while a long log is read. ``now``: the won campaign's time."""
    store = await EtcdFactStore.replay_stepped(client, election, election.prefix)
    return primary_cluster(store, claim, ttl, check_interval, now)


def primary_cluster(store: EtcdFactStore, claim: Claim, ttl: float, check_interval: float, now: float) -> Cluster:
    store.save_term(claim.term)  # the mirror's copy: etcd has it already
    replicas = EtcdReplicaSet(
        count=1,
        term=claim.term,
        primary=0,
        promoted_at=now,
        save_term=store.save_term,
        addresses=[claim.address],
    )
    replicas.store = store  # its quorum ends the moment the store is deposed
    replicas.fresh_until = now + check_interval
    cluster = Cluster(
        store=store,
        replicas=replicas,
        leases=LeaseTable(claim.term, now, ttl, check_interval),
        ttl=ttl,
        check_interval=check_interval,
        demand=store.load_demand(),
    )
    return cluster


async def keep_primary(cluster: Cluster, election: EtcdElection, check_interval: float) -> str:
    """Confirm the claim every ``check_interval / 3`` until it is lost; return why. Each confirmation moves
    ``fresh_until`` to its send time + ``check_interval``."""
    replicas = cluster.replicas
    assert isinstance(replicas, EtcdReplicaSet)
    store = cluster.store
    try:
        while True:
            sent = trio.current_time()
            ok = False
            with trio.move_on_after(check_interval):
                try:
                    ok = await trio.to_thread.run_sync(election.confirm, abandon_on_cancel=True)
                except EtcdError as exc:
                    log.warning("primary claim not confirmed: %s", exc)
            if isinstance(store, EtcdFactStore) and store.deposed:
                return f"deposed: {store.deposed}"
            if ok:
                replicas.fresh_until = max(replicas.fresh_until, sent + check_interval)
            elif election.claim is None:
                return "the primary claim was lost"
            await trio.sleep_until(sent + check_interval / 3)
    finally:
        replicas.lose()
