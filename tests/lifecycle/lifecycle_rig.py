"""A MockClock rig for the provisioning lifecycle: fake controller (leases + fact log), a fake session view, the
in-memory provider, and the real lease keepers, gate, executor, offer feed and reconcile loop wired as the daemon
wires them.

The planner's wall clock is ``BASE + trio.current_time()``, so launch times (the fake provider stamps ``BASE``) and
virtual time agree.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import attrs
import trio
import trio.testing

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.session_settings import LinkState
from provisionerd.controller.view import ControllerView
from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    DemandSnapshot,
    Fact,
    HostState,
    HostStatus,
    ResourceShape,
)
from provisionerd.execution.executor import Executor, ExecutorSettings
from provisionerd.execution.feedback import Feedback, open_feedback
from provisionerd.execution.gate import MutationGate
from provisionerd.execution.loop import LoopSettings, ReconcileLoop
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_controller import FakeController, FakeLink
from provisionerd.testing.fake_provider import FakeProvider

BASE = 1_700_000_000.0
CLUSTER = "c1"


class FakeSession:
    """The part of ``ControllerSession`` the loop reads: a view per generation, ``state`` and ``changed()``."""

    def __init__(self) -> None:
        self.state = LinkState.UP
        self.generation = 1
        self.view: ControllerView | None = ControllerView(1, "ctl0:7400", 1, FactView(), {})
        self._changed = trio.Event()

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        await self._changed.wait()

    def request_resync(self) -> int:
        """The fake's hosts are set by the test directly: a resync is in at once (a view of the same generation
        whose ``sync_seq`` answers the want)."""
        assert self.view is not None
        self.view.sync_seq += 1
        self.notify()
        return self.view.sync_seq

    def set_demand(self, seq: int, *items: DemandItem) -> None:
        assert self.view is not None
        self.view.set_demand(DemandSnapshot(seq, tuple(items)))
        self.notify()

    def set_hosts(self, *hosts: HostState) -> None:
        assert self.view is not None
        self.view.apply_hosts(hosts)
        self.notify()

    def rejoin(self, facts: list[CommittedFact]) -> None:
        """A new generation built from the controller's facts alone (the resync); demand arrives later."""
        self.generation += 1
        view = ControllerView(self.generation, "ctl0:7400", 1, FactView(), {})
        for committed in facts:
            view.facts.apply(committed)
        self.view = view
        self.notify()


@attrs.define(eq=False)
class ViewCommitter:
    """Commits through the fake link, then folds the log into the current view in index order, as the session's
    pushes do (folding each ack's fact as its task resumes would drop a lower index acknowledged after a higher one:
    the view ignores facts at or below its last index, and a hundred concurrent commits resume in any order)."""

    link: FakeLink
    session: FakeSession

    async def commit(self, fact: Fact) -> int:
        index = await self.link.commit(fact)
        view = self.session.view
        if view is not None:
            log = self.link.controller.facts
            while view.facts.last_index < len(log):
                view.apply_fact(log[view.facts.last_index])
            self.session.notify()
        return index


def item(demand_id: str = "d", count: int = 1, ncpus: int = 2, **kwargs: Any) -> DemandItem:
    return DemandItem(demand_id, ResourceShape(ncpus=ncpus), count, **kwargs)


@attrs.define(eq=False)
class Rig:
    controller: FakeController
    link: FakeLink
    session: FakeSession
    providers: dict[str, FakeProvider]
    keepers: dict[str, LeaseKeeper]
    gate: MutationGate
    executor: Executor
    feed: OfferFeed
    loop: ReconcileLoop
    events: EventLog
    policy: Policy
    feedback: Feedback

    def facts(self, kind: type | None = None) -> list[Any]:
        return [c.fact for c in self.controller.facts if kind is None or isinstance(c.fact, kind)]

    def calls(self, provider: str = "p", action: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return [c for c in self.providers[provider].calls if action is None or c[0] == action]

    def running(self, provider: str = "p") -> list[dict[str, Any]]:
        return [m for m in self.providers[provider].machines.values() if m["status"] == "running"]

    def join(self, machine_id: str, status: HostStatus = HostStatus.IDLE, since: float | None = None) -> None:
        """The machine's worker joined (the controller pushes its host state), reporting what its template declares
        (a healthy agent)."""
        assert self.session.view is not None
        record = self.session.view.facts.machines[machine_id]
        self.join_reporting(machine_id, self.providers[record.provider].report(record.template_id), status, since)

    def join_reporting(
        self, machine_id: str, report: dict[str, str], status: HostStatus = HostStatus.IDLE, since: float | None = None
    ) -> None:
        """The machine's worker joined with ``report`` as its capabilities."""
        assert self.session.view is not None
        record = self.session.view.facts.machines[machine_id]
        when = BASE + trio.current_time() if since is None else since
        self.session.set_hosts(
            HostState(record.instance_ref, record.provider, machine_id, status, when, capabilities=report)
        )

    def events_of(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events.of_kind(event) if all(e.get(k) == v for k, v in match.items())]

    async def wait_for(self, predicate: Callable[[], bool], limit: float = 10_000.0) -> float:
        """Wait (virtual time) until ``predicate()``; the virtual time it became true (exact for predicates on
        the facts or the view, which notify; others are checked every virtual second)."""
        with trio.fail_after(limit):
            while not predicate():
                with trio.move_on_after(1.0):
                    await self.session.changed()
        return trio.current_time()


def build_rig(
    nursery: trio.Nursery,
    providers: dict[str, FakeProvider],
    *,
    policy: Policy | None = None,
    executor_settings: dict[str, Any] | None = None,
    loop_settings: LoopSettings | None = None,
    ttl: float = 30.0,
    offer_interval: float = 60.0,
    recent_facts: Any = None,
) -> Rig:
    events = EventLog(keep=100_000)
    controller = FakeController(ttl=ttl, grace=30.0)
    link = controller.link("prov-a")
    session = FakeSession()
    rng = random.Random(7)
    keepers = {
        name: LeaseKeeper(name, link, margin=2.0, backoff=Backoff(initial=0.5, max=8.0), rng=rng, events=events)
        for name in providers
    }
    committer = ViewCommitter(link, session)
    gate = MutationGate(keepers, committer, events)
    policy = policy or Policy(cluster=CLUSTER, provisioning_timeout=600.0, join_deadline=900.0, idle_time=300.0)

    def wall() -> float:
        return BASE + trio.current_time()

    settings = ExecutorSettings(
        cluster=CLUSTER,
        controllers=("ctl0:7400",),
        provisioning_timeout=policy.provisioning_timeout,
        return_timeout=policy.provisioning_timeout,
        **(executor_settings or {}),
    )
    clients = {name: PluginClient(fake) for name, fake in providers.items()}
    feedback = open_feedback()
    executor = Executor(
        settings,
        clients,
        gate,
        keepers,
        committer,
        events,
        facts=lambda: None if session.view is None else session.view.facts,
        wall=wall,
        feedback=feedback.send,
    )
    feed = OfferFeed(clients, events, interval=offer_interval, feedback=feedback.send, wall=wall)
    loop = ReconcileLoop(
        session,
        keepers,
        executor,
        feed,
        policy,
        events,
        settings=loop_settings or LoopSettings(replan_interval=10.0, reclaim_interval=30.0, recover_after=30.0),
        wall=wall,
        incarnation="i1",
        jitter_seed=3,
        feedback=feedback.receive,
        recent_facts=recent_facts,
    )
    return Rig(controller, link, session, providers, keepers, gate, executor, feed, loop, events, policy, feedback)


async def start_rig(nursery: trio.Nursery, rig: Rig, *, loop: bool = True) -> None:
    for keeper in rig.keepers.values():
        await nursery.start(keeper.run)
    for keeper in rig.keepers.values():
        await keeper.wait_valid()
    await nursery.start(functools.partial(rig.feed.run, skip=rig.loop.unhealthy))
    if loop:
        await nursery.start(rig.loop.run)
