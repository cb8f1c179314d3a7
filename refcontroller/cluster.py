"""The whole controller state behind one synchronous facade: what every request does, given ``now``.

The trio server (``server.py``, ``session.py``) only moves frames; every decision is made here, on plain values,
so the rules can be tested with an injected clock. Two clocks are passed in: ``now`` is the controller's monotonic
clock (leases, grace) and ``wall`` is wall-clock epoch seconds (``HostState.since``, token use times).

Requests name the ``replica`` they arrived on: only the primary serves leases and facts (``not_primary``). A lease
``holder`` (and a fact's ``sender``) is ``leases.holder_key(identity, instance)`` of the provisioner process that
asks, never its configured identity alone: it is what the lease table compares, what ``save_grantee`` records and
what a committed fact's ``holder`` column holds.

A write the store cannot make durable (``store.StoreFailure``: disk full, I/O error) is answered, never raised out
to the connection: a fact commit, a lease grant that must first record its grantee, and a worker's token use are
rejected with ``storage_failure`` (the link stays up); an admin demand change or failover raises ``ValueError``
(the admin reply says it). In every case the store rolled the transaction back and nothing held in memory here
advances (no lease is granted, no host identified, the demand and the term stay), so the controller's state stays
the one its store holds. Each failure is logged at WARNING and counted in ``storage_failures`` (in ``status``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Self

import attrs

from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    DemandSnapshot,
    DrainRequested,
    Epoch,
    Fact,
    HostState,
    HostStatus,
    InstanceFact,
    LicenseUse,
)
from refcontroller import commits, demand
from refcontroller.credentials_address import AddressBoundJoin
from refcontroller.jsonconv import fact_from_json, unstructure
from refcontroller.leases import Denied, Granted, LeaseTable
from refcontroller.paging import PAGE_BYTES, PAGE_ITEMS, encoded_bound
from refcontroller.replicas import ReplicaSet
from refcontroller.rules import RULES
from refcontroller.store import FactStore, StoreFailure
from refcontroller.workers import HostTable, admit, admit_by_address, revoke_lost

log = logging.getLogger(__name__)

NOT_PRIMARY = "not_primary"


@attrs.frozen
class ResyncPlan:
    """What one resync sends: fact index ranges (inclusive, one per page) fixed when it starts, and the hosts.

    No facts means no ranges; the session adds the host pages and sends one empty page when there is nothing.
    """

    providers: tuple[str, ...]
    fact_ranges: tuple[tuple[int, int], ...]  # (first_index, last_index) per page of facts
    hosts: tuple[HostState, ...]
    #: The log index the resync set is fixed at: the facts live as of it (``store_lifecycle``).
    as_of: int = 0
    #: The facts after the request's ``after_index`` (every one, live or ended), not the whole resync set.
    incremental: bool = False


#: Facts of a resync page decoded from the store's JSON per task step (~1 ms on a loaded 2-core machine): the
#: session's reader answers heartbeats between the steps, where a page of 275 facts read in one step held it 5-8 ms
#: of CPU (20-30 ms of wall time when the machine is loaded).
DECODE_STEP = 100
MAX_DECODE_STEP = 1 << 62

#: Facts sized per planning step: one ordered index scan of at most this many rows a provider (~3 ms at 100k live
#: facts on a loaded 2-core machine), then the session yields to the loop.
PLAN_CHUNK = 500


@attrs.define(eq=False)
class ResyncPlanner:
    """Builds a :class:`ResyncPlan` a chunk at a time, so planning a resync of 100k facts never holds the loop.

    Each ``step`` sizes the next ``PLAN_CHUNK`` facts of the set as of ``as_of`` (``FactStore.resync_sizes``, one
    index scan from where the last step stopped) and pages them exactly as ``paging.page_bounds`` pages the whole
    list: the pages do not depend on where the chunks fall, nor on what is committed between the steps (the set as
    of ``as_of`` is fixed, ``store_lifecycle``). ``step`` returns the plan once every fact is sized, else ``None``.
    """

    store: FactStore
    providers: tuple[str, ...]
    hosts: tuple[HostState, ...]
    as_of: int
    incremental: bool
    after: int  # the last index sized so far (the request's ``after_index`` for an incremental one)
    chunk: int = PLAN_CHUNK
    max_bytes: int = PAGE_BYTES
    max_items: int = PAGE_ITEMS
    ranges: list[tuple[int, int]] = attrs.field(factory=list)
    _first: int = 0  # first index of the page being filled (0: none yet)
    _last: int = 0
    _count: int = 0
    _used: int = 0

    def step(self) -> ResyncPlan | None:
        sizes = self.store.resync_sizes(self.providers, self.after, self.as_of, self.chunk, every=self.incremental)
        for index, size in sizes:
            bound = encoded_bound(size)
            if (
                RULES.page_bounds
                and self._count
                and (self._used + bound > self.max_bytes or self._count >= self.max_items)
            ):
                self.ranges.append((self._first, self._last))
                self._count = self._used = 0
            if not self._count:
                self._first = index
            self._last, self._count, self._used = index, self._count + 1, self._used + bound
        if len(sizes) == self.chunk:
            self.after = sizes[-1][0]
            return None
        if self._count:
            self.ranges.append((self._first, self._last))
            self._count = 0
        return ResyncPlan(self.providers, tuple(self.ranges), self.hosts, self.as_of, self.incremental)


@attrs.define(eq=False)
class Cluster:
    store: FactStore
    replicas: ReplicaSet
    leases: LeaseTable
    ttl: float
    check_interval: float
    demand: DemandSnapshot
    hosts: HostTable = attrs.field(factory=HostTable)
    #: The host changes commits made since the last ``take_host_changes`` (the caller pushes them).
    _host_changes: list[HostState] = attrs.field(factory=list, init=False)
    #: Writes the store could not make durable (each one answered ``storage_failure`` or an admin error).
    storage_failures: int = 0

    @classmethod
    def open(cls, store: FactStore, replica_count: int, ttl: float, check_interval: float, now: float) -> Self:
        """Start after a (re)start: elect replica 0 in a new term (saved), with an empty lease table."""
        replicas = ReplicaSet.elect(replica_count, store.load_term(), store.save_term, now)
        return cls(
            store=store,
            replicas=replicas,
            leases=LeaseTable(replicas.term, now, ttl, check_interval),
            ttl=ttl,
            check_interval=check_interval,
            demand=store.load_demand(),
        )

    @property
    def term(self) -> int:
        return self.replicas.term

    def is_primary(self, replica: int) -> bool:
        return self.replicas.is_primary(replica)

    # --- leases -----------------------------------------------------------------------------------------------

    def storage_failed(self, what: str, exc: StoreFailure) -> commits.Rejection:
        self.storage_failures += 1
        log.warning("storage failure (%s): %s; rolled back, answered storage_failure", what, exc)
        return commits.Rejection(commits.STORAGE_FAILURE, f"{what} not made durable: {exc}")

    def storage_fault(self, what: str, exc: StoreFailure) -> commits.Rejection:
        """A read the store could not answer truly (``store_rows.StoreCorrupt``: a row that fails its checksum):
        counted with the write failures and answered ``storage_failure`` too."""
        self.storage_failures += 1
        log.error("storage fault (%s): %s; answered storage_failure", what, exc)
        return commits.Rejection(commits.STORAGE_FAILURE, f"{what}: {exc}")

    def acquire(self, replica: int, provider: str, holder: str, now: float) -> Granted | Denied | commits.Rejection:
        """Grant or deny; ``storage_failure`` when the new grantee could not be recorded (no lease is granted)."""
        if not self.is_primary(replica):
            return Denied(provider, NOT_PRIMARY)
        previous = self.store.last_grantee(provider)
        if previous is None:  # a store written before grantees were recorded: the latest fact's writer
            latest = self.store.latest(provider)
            previous = latest.holder if latest is not None else None
        before = self.leases.live(provider, now)
        result = self.leases.acquire(
            provider, holder, now, quorum_fresh=self.replicas.quorum_fresh, previous_holder=previous
        )
        if isinstance(result, Granted) and previous != holder:
            try:
                self.store.save_grantee(provider, holder)
            except StoreFailure as exc:
                if before is None:  # a new grant nobody was told of; an extension of a live lease may stand
                    self.leases.withdraw(result.lease)
                return self.storage_failed(f"lease grant of {provider!r}", exc)
        return result

    def renew(self, replica: int, provider: str, holder: str, epoch: Epoch, now: float) -> Granted | Denied:
        if not self.is_primary(replica):
            return Denied(provider, NOT_PRIMARY)
        return self.leases.renew(provider, holder, epoch, now, quorum_fresh=self.replicas.quorum_fresh)

    def release(self, replica: int, provider: str, holder: str, epoch: Epoch, now: float) -> commits.Rejection | None:
        if not self.is_primary(replica):
            return commits.Rejection(NOT_PRIMARY)
        if not self.leases.release(provider, holder, epoch, now):
            return commits.Rejection(commits.STALE_EPOCH, f"the live lease on {provider!r} is not {epoch} of yours")
        return None

    # --- facts ------------------------------------------------------------------------------------------------

    def commit(
        self, replica: int, fact: Fact, sender: str, now: float, wall: float = 0.0
    ) -> CommittedFact | commits.Rejection:
        """Commit ``fact`` for lease holder ``sender`` or reject it (see ``commits.py`` for the order of checks).

        ``wall`` (epoch seconds) is stored as its commit time (``CommittedFact.committed_at``; 0: not known, what a
        caller without a wall clock records); a retried commit answers the first commit's copy and time."""
        if not self.is_primary(replica):
            return commits.Rejection(NOT_PRIMARY)
        found = commits.problems(fact)
        if found:
            return commits.Rejection(commits.INVALID, "; ".join(found))
        if not self.replicas.quorum_fresh:
            return commits.Rejection(commits.NO_QUORUM)
        existing = self.store.find(fact)  # before the epoch: a retry whose ack was lost is in the log (§6.2)
        if existing is not None and RULES.fact_rules:
            return existing
        rejection = commits.epoch_rejection(
            fact,
            sender=sender,
            lease=self.leases.live(fact.provider, now),
            term=self.term,
            latest=self.store.latest(fact.provider),
        )
        if rejection is not None:
            return rejection
        if existing is not None:  # only with the fact_rules rule off (a test hook)
            return existing
        try:
            committed = self.store.append(fact, sender, wall)
        except StoreFailure as exc:
            return self.storage_failed(f"{type(fact).__name__} {fact.op_id!r}", exc)
        if isinstance(fact, InstanceFact):
            host = self.hosts.identify(fact.instance_ref, fact.machine_id, fact.hostname, fact.address)
            if host is not None and self.store.draining(fact.provider, fact.machine_id):
                host = self.hosts.drain(fact.instance_ref) or host
            if host is not None:
                self._host_changes.append(host)
        elif isinstance(fact, DrainRequested):  # no new work on them from now on (workers.HostTable.placeable)
            for ref in self.hosts.by_machine(fact.provider, fact.machine_ids):
                drained = self.hosts.drain(ref)
                if drained is not None:
                    self._host_changes.append(drained)
        if self.store.ended_refs:  # their lifecycles ended: history now, their hosts are not state any more
            self.hosts.drop(self.store.ended_refs)
        return committed

    def take_host_changes(self) -> list[HostState]:
        """The host changes the commits made since the last call, oldest first (feedback as a returned value: the
        session that committed pushes them to the provisioners)."""
        taken, self._host_changes = self._host_changes, []
        return taken

    def resync_plan(self, providers: Collection[str], after_index: int = 0, incarnation: str = "") -> ResyncPlan:
        """Fix the facts (up to the current last index) and the hosts that a resync of ``providers`` sends.

        Incremental (every fact after ``after_index``) when the requester names this store's incarnation and an
        index within its log; else the whole resync set (protocol §6.3). All at once: the session plans in steps
        (``resync_planner``), this is the same plan for callers that may take the whole time."""
        planner = self.resync_planner(providers, after_index, incarnation)
        while (plan := planner.step()) is None:
            pass
        return plan

    def resync_planner(self, providers: Collection[str], after_index: int = 0, incarnation: str = "") -> ResyncPlanner:
        """``resync_plan`` in bounded steps: the index, the hosts and the kind are fixed now, the pages as it steps."""
        providers = tuple(sorted(set(providers)))
        as_of = self.store.last_index()
        incremental = 0 < after_index <= as_of and incarnation == self.store.incarnation
        hosts = tuple(self.hosts.for_providers(providers))
        return ResyncPlanner(self.store, providers, hosts, as_of, incremental, after_index if incremental else 0)

    def resync_facts(self, plan: ResyncPlan, page: int) -> list[CommittedFact]:
        return [fact for chunk in self.resync_facts_in_steps(plan, page, MAX_DECODE_STEP) for fact in chunk]

    def resync_facts_in_steps(
        self, plan: ResyncPlan, page: int, step: int = DECODE_STEP
    ) -> Iterator[list[CommittedFact]]:
        """The facts of page ``page`` of ``plan``, decoded ``step`` at a time: the page's rows are read at the first
        ``next`` (one query), each later ``next`` decodes the next ``step`` of them (a caller checkpoints between)."""
        first, last = plan.fact_ranges[page]
        bodies = self.store.fact_bodies(plan.providers, first, last, as_of=None if plan.incremental else plan.as_of)
        for start in range(0, len(bodies), step):
            yield [CommittedFact(i, fact_from_json(body), at) for i, body, at in bodies[start : start + step]]

    # --- workers ----------------------------------------------------------------------------------------------

    def admit_worker(
        self,
        replica: int,
        instance_ref: str,
        token: str,
        wall: float,
        *,
        credential: str | None = None,
        live: bool = False,
    ) -> HostState | commits.Rejection:
        """``workers.admit``: ``credential`` is what a spent token is exchanged for; ``live``: a session is open."""
        if not self.is_primary(replica):
            return commits.Rejection(NOT_PRIMARY)
        known = self.hosts.get(instance_ref)
        if known is not None and known.status is HostStatus.LOST:
            return commits.Rejection("token_invalid", f"instance {instance_ref!r} is lost: it cannot rejoin")
        if known is None and self.store.instance_ended(instance_ref):
            return commits.Rejection("token_invalid", f"instance {instance_ref!r} ended: it cannot rejoin")
        try:
            admitted = admit(self.store, instance_ref, token, wall, credential=credential, live=live)
        except StoreFailure as exc:
            return self.storage_failed(f"token use of {instance_ref!r}", exc)
        if isinstance(admitted, HostState):
            admitted = self.hosts.add(self._drained_if_asked(admitted))
        return admitted

    def _drained_if_asked(self, host: HostState) -> HostState:
        """A host rejoining (after a restart of this controller, say) stays draining if the facts say so."""
        if self.store.draining(host.provider, host.machine_id):
            return attrs.evolve(host, draining=True)
        return host

    def admit_by_address(
        self,
        replica: int,
        join: tuple[str, str],
        peer: str,
        policy: AddressBoundJoin | None,
        wall: float,
        credential: str,
        live: frozenset[str] = frozenset(),
    ) -> HostState | commits.Rejection:
        """``workers.admit_by_address`` for ``join = (machine_id, secret)`` arriving from ``peer``; ``live``: the
        instances with a worker session open now."""
        if not self.is_primary(replica):
            return commits.Rejection(NOT_PRIMARY)
        try:
            admitted = admit_by_address(self.store, policy, *join, peer, wall, credential=credential, live=live)
        except StoreFailure as exc:
            return self.storage_failed(f"address-bound join of {join[0]!r}", exc)
        if isinstance(admitted, HostState):
            admitted = self.hosts.add(self._drained_if_asked(admitted))
        return admitted

    def credential_delivered(self, instance_ref: str, wall: float) -> bool:
        """The worker sent a frame after the reply carrying its credential (``store_credentials.delivered_at``).
        ``False`` when the store failed (logged): the caller marks it again at the worker's next frame."""
        try:
            self.store.credential_delivered(instance_ref, wall)
        except StoreFailure as exc:
            log.warning("credential of %r not marked delivered: %s", instance_ref, exc)
            return False
        return True

    def worker_status(
        self, instance_ref: str, status: HostStatus, wall: float, reclaim_at: float = 0.0, rebalance_at: float = 0.0
    ) -> HostState | None:
        """Record a status the worker reported (``idle``/``busy``) and its reclaim notices (epoch seconds, 0 =
        none; protocol §6.4); ``None`` when nothing changed."""
        if status not in (HostStatus.IDLE, HostStatus.BUSY):
            raise ValueError(f"a worker reports idle or busy, not {status.value!r}")
        return self.hosts.set_status(instance_ref, status, wall, reclaim_at, rebalance_at)

    def worker_probed(self, instance_ref: str, capabilities: Mapping[str, str], probed_at: float) -> HostState | None:
        """Record a worker's re-probe after its join (``WorkerStatus.capabilities``, already bounded by
        ``workers.reported_capabilities``; protocol §6.4 "Health after join"): the whole report replaces the
        host's, stamped ``probed_at``; ``None`` when unknown, lost or unchanged."""
        if not (math.isfinite(probed_at) and probed_at > 0):
            raise ValueError(f"a re-probe's time is epoch seconds above 0, not {probed_at!r}")
        return self.hosts.report(instance_ref, capabilities, probed_at)

    def worker_lost(self, instance_ref: str, wall: float) -> HostState | None:
        revoke_lost(self.store, instance_ref, wall)  # durable: refused after a restart too
        return self.hosts.set_status(instance_ref, HostStatus.LOST, wall)

    # --- admin ------------------------------------------------------------------------------------------------

    def set_demand(self, items: Sequence[DemandItem], licenses: Sequence[LicenseUse] = ()) -> DemandSnapshot | None:
        """Replace the demand (stored before it takes effect); the new snapshot, or ``None`` if unchanged.

        Raises ``ValueError`` listing every problem of an unacceptable demand.
        """
        found = demand.problems(items) + demand.license_problems(licenses)
        if found:
            raise ValueError("; ".join(found))
        snapshot = demand.next_snapshot(self.demand, items, licenses)
        if snapshot is not None:
            try:
                self.store.save_demand(snapshot)
            except StoreFailure as exc:
                raise ValueError(self.storage_failed(f"demand seq {snapshot.seq}", exc).detail) from exc
            self.demand = snapshot
        return snapshot

    def fail_over(self, now: float, target: int | None = None) -> int:
        """Promote ``target`` (default: the next replica) in a new term, with an empty lease table."""
        try:
            primary = self.replicas.fail_over(now, target)  # saves the term before anything changes
        except StoreFailure as exc:
            raise ValueError(self.storage_failed(f"term {self.term + 1}", exc).detail) from exc
        self.leases = LeaseTable(self.term, now, self.ttl, self.check_interval)
        return primary

    def set_quorum(self, fresh: bool) -> None:
        self.replicas.set_quorum(fresh)

    def status(self, now: float) -> dict[str, Any]:
        """The admin status document (JSON-ready)."""
        replicas = self.replicas
        return {
            "replicas": [
                {"index": i, "address": replicas.address_of(i), "primary": replicas.is_primary(i)}
                for i in range(replicas.count)
            ],
            "primary": replicas.primary,
            "incarnation": self.store.incarnation,
            "term": replicas.term,
            "quorum_fresh": replicas.quorum_fresh,
            "grace_remaining_s": round(max(0.0, self.leases.grace_ends_at - now), 3),
            "lease_ttl_s": self.ttl,
            "check_interval_s": self.check_interval,
            "leases": [
                {
                    "provider": lease.provider,
                    "holder": lease.holder,
                    "epoch": str(lease.epoch),
                    "expires_in_s": round(lease.expires_at - now, 3),
                }
                for lease in self.leases.live_leases(now)
            ],
            "latest_epochs": {p: str(e) for p, e in sorted(self.store.latest_epochs().items())},
            "demand": {"seq": self.demand.seq, "items": unstructure(self.demand.items, tuple[DemandItem, ...])},
            "facts": {
                "count": self.store.count(),
                "live": self.store.live_count(),
                "last_index": self.store.last_index(),
            },
            "storage_failures": self.storage_failures,
            "hosts": [unstructure(host, HostState) for host in self.hosts.all()],
            #: Where new work may go: not draining, not busy, not lost (``workers.HostTable.placeable``).
            "placeable": [host.instance_ref for host in self.hosts.placeable()],
        }
