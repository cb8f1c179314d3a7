"""One replica of the reference controller on etcd: once elected, a ``Cluster`` over the replayed store, kept
primary by a confirming loop (issue 22 items 1-2; ``election_etcd`` and ``store_etcd`` say the rules).

``promote(...)`` builds the primary's ``Cluster`` after a won campaign: the store replayed from etcd's log, the term
the election wrote, a new (empty) lease table promoted *now*, so its grace (``leases.LeaseTable``) covers whatever
lease the previous primary granted: only each provider's durable last grantee is re-granted before it ends.

``keep_primary`` runs while the replica is primary: every ``check_interval / 3`` it refreshes the etcd lease and
reads the claim back through a majority (``EtcdElection.confirm``). ``replicas.quorum_fresh`` is true only while
the last confirming request was *sent* less than ``check_interval`` ago, so a grant or renewal always rests on a
linearizable read within ``T_check``; a lost claim (or a write etcd refused: ``store.on_deposed``) ends it: the
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


def promote(
    client: EtcdClient,
    election: EtcdElection,
    claim: Claim,
    ttl: float,
    check_interval: float,
    now: float,
) -> Cluster:
    """The primary's ``Cluster`` after ``election`` won ``claim`` (blocking: replays the log)."""
    store = EtcdFactStore.replay(client, election, election.prefix)
    store.save_term(claim.term)  # the mirror's copy: etcd has it already
    replicas = ReplicaSet(
        count=1, term=claim.term, primary=0, promoted_at=now, save_term=store.save_term, addresses=[claim.address]
    )
    cluster = Cluster(
        store=store,
        replicas=replicas,
        leases=LeaseTable(claim.term, now, ttl, check_interval),
        ttl=ttl,
        check_interval=check_interval,
        demand=store.load_demand(),
    )
    store.on_deposed = lambda _reason: replicas.set_quorum(False)
    return cluster


async def keep_primary(cluster: Cluster, election: EtcdElection, check_interval: float) -> str:
    """Confirm the claim until it is lost; return why. ``quorum_fresh`` follows the confirmations (see above)."""
    fresh = _Freshness(trio.current_time())  # the campaign's own transaction went through a majority just now
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expire, cluster.replicas, fresh, check_interval)
        reason = await _confirm_loop(cluster, election, fresh, check_interval)
        nursery.cancel_scope.cancel()
    cluster.replicas.set_quorum(False)
    return reason


class _Freshness:
    def __init__(self, confirmed_at: float) -> None:
        self.confirmed_at = confirmed_at
        self.renewed = trio.Event()

    def confirm(self, sent: float) -> None:
        self.confirmed_at = sent
        self.renewed.set()
        self.renewed = trio.Event()


async def _expire(replicas: ReplicaSet, fresh: _Freshness, check_interval: float) -> None:
    """Mark the quorum lost the moment the last confirmation is ``check_interval`` old (a confirm may hang)."""
    while True:
        renewed = fresh.renewed
        with trio.move_on_at(fresh.confirmed_at + check_interval):
            await renewed.wait()
            continue
        replicas.set_quorum(False)
        await renewed.wait()


async def _confirm_loop(cluster: Cluster, election: EtcdElection, fresh: _Freshness, check_interval: float) -> str:
    store = cluster.store
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
            fresh.confirm(sent)
            cluster.replicas.set_quorum(True)
        elif election.claim is None:
            return "the primary claim was lost"
        await trio.sleep_until(sent + check_interval / 3)
