"""A hypothesis state machine over the composed core: epochs only grow, one live holder, the fence holds."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from rc_factories import intent

from provisionerd.domain.model import CommittedFact, Epoch
from refcontroller.cluster import Cluster
from refcontroller.commits import Rejection
from refcontroller.leases import Granted
from refcontroller.store import FactStore

TTL, CHECK = 10.0, 2.0
PROVIDERS = ("p1", "p2")
HOLDERS = ("d1", "d2")
#: Steps around the interesting boundaries: well inside a TTL, just past TTL + check (the grace), far past.
STEPS = (0.0, 1.0, 4.0, 10.0, 12.5, 40.0)


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = FactStore.open(":memory:")  # durability is test_cluster's business; this is about rules
        self.now = 0.0
        self.cluster = Cluster.open(self.store, replica_count=3, ttl=TTL, check_interval=CHECK, now=self.now)
        self.granted: dict[str, list[Epoch]] = {p: [] for p in PROVIDERS}  # every epoch granted, in order
        self.held: dict[tuple[str, str], list[Epoch]] = {}  # every epoch each holder was ever granted
        self.grantee: dict[str, str] = {}  # who each provider was last newly granted to, over all terms
        self.ops = 0

    def teardown(self) -> None:
        self.store.close()

    @rule(dt=st.sampled_from(STEPS))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(p=st.sampled_from(PROVIDERS), h=st.sampled_from(HOLDERS))
    def acquire(self, p: str, h: str) -> None:
        before = self.cluster.leases.live(p, self.now)
        result = self.cluster.acquire(self.cluster.replicas.primary, p, h, self.now)
        if isinstance(result, Granted):
            assert self.cluster.replicas.quorum_fresh
            assert before is None or before.holder == h
            if before is None:
                # In the grace after a promotion only the last grantee may be granted: anyone else could overlap
                # a lease the previous primary granted (whether or not its holder has committed a fact yet).
                in_grace = self.now < self.cluster.leases.grace_ends_at
                assert not in_grace or self.grantee.get(p) == h
                self.grantee[p] = h
            epochs = self.granted[p]
            assert not epochs or result.lease.epoch >= epochs[-1]
            epochs.append(result.lease.epoch)
            self.held.setdefault((p, h), []).append(result.lease.epoch)

    @rule(p=st.sampled_from(PROVIDERS), h=st.sampled_from(HOLDERS))
    def renew(self, p: str, h: str) -> None:
        epoch = self.held.get((p, h), [None])[-1]
        if epoch is not None:
            result = self.cluster.renew(self.cluster.replicas.primary, p, h, epoch, self.now)
            if isinstance(result, Granted):
                assert result.lease.epoch == epoch

    @rule(p=st.sampled_from(PROVIDERS), h=st.sampled_from(HOLDERS), age=st.integers(0, 3))
    def commit(self, p: str, h: str, age: int) -> None:
        """Commit with the holder's latest epoch, or (age > 0) an older one it was granted before."""
        epochs = self.held.get((p, h))
        if not epochs:
            return
        epoch = epochs[max(0, len(epochs) - 1 - age)]
        self.ops += 1
        live = self.cluster.leases.live(p, self.now)
        result = self.cluster.commit(self.cluster.replicas.primary, intent(p, epoch, f"op-{self.ops}"), h, self.now)
        if isinstance(result, CommittedFact):
            # The fence: only the live lease's holder with its epoch, under a fresh quorum.
            assert live is not None and live.epoch == epoch and live.holder == h
            assert self.cluster.replicas.quorum_fresh
        else:
            assert isinstance(result, Rejection)

    @rule(to=st.one_of(st.none(), st.integers(0, 2)))
    def fail_over(self, to: int | None) -> None:
        term = self.cluster.term
        if to == self.cluster.replicas.primary:
            return
        self.cluster.fail_over(self.now, to)
        assert self.cluster.term == term + 1 == self.store.load_term()
        assert self.cluster.leases.live_leases(self.now) == []

    @rule(fresh=st.booleans())
    def quorum(self, fresh: bool) -> None:
        self.cluster.set_quorum(fresh)

    @invariant()
    def committed_epochs_never_go_back(self) -> None:
        last: dict[str, Epoch] = {}
        for committed in self.store.all_facts():
            p = committed.fact.provider
            assert committed.fact.epoch >= last.get(p, Epoch(0, 0))
            last[p] = committed.fact.epoch

    @invariant()
    def epochs_are_unique_across_providers(self) -> None:
        distinct = {e for epochs in self.granted.values() for e in set(epochs)}
        assert sum(len(set(epochs)) for epochs in self.granted.values()) == len(distinct)


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
