"""Builders for reconcile tests: offers, demand, and a tiny world of committed facts and hosts.

``World`` plays the controller's fact log and host table, plus the simplest driver: it commits the fact each
planned action calls for, and lets a test fulfil requests and move hosts by hand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, MutableMapping

import attrs

from provisionerd.domain.actions import Action, DrainMachines, FailRequest, MarkLost, RequestMachines, ReturnMachines
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
    Lost,
    Offer,
    PriceQuote,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
)
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.health import confirming_report
from provisionerd.planner.in_flight import InFlight, PendingRequest
from provisionerd.planner.offers import Catalog
from provisionerd.planner.plan import Plan, plan
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import ActionDropped, PlannerState, observe

NOW = 1_800_000_000.0
EPOCH = Epoch(1, 1)
CLUSTER = "c1"


def offer(
    provider: str = "p",
    template: str = "t",
    *,
    max_number: int = 100,
    ncpus: int = 4,
    mem: int = 8192,
    gpus: int = 0,
    arch: str = "X86_64",
    price: float | None = 0.1,
    **extra: str,
) -> Offer:
    attributes = {
        "ncpus": ("Numeric", str(ncpus)),
        "mem": ("Numeric", str(mem)),
        "ngpus": ("Numeric", str(gpus)),
        "type": ("String", arch),
        **{k: ("String", v) for k, v in extra.items()},
    }
    quote = None if price is None else PriceQuote(price, "USD", "hour", "test", "2026-01-01T00:00:00Z")
    return Offer(provider, template, max_number, attributes, quote)


def item(
    demand_id: str = "d", count: int = 1, *, cap: float | None = None, providers: Iterable[str] = (), **shape
) -> DemandItem:
    return DemandItem(demand_id, ResourceShape(**shape), count, max_hourly_cost=cap, providers=tuple(providers))


def snapshot(seq: int, *items: DemandItem) -> DemandSnapshot:
    return DemandSnapshot(seq, tuple(items))


def token_hash(ref: str) -> str:
    return hashlib.sha256(ref.encode()).hexdigest()


@attrs.define
class World:
    """Committed facts (folded as they come), hosts by instance_ref, and the planner's state and clock."""

    offers: list[Offer]
    policy: Policy = attrs.field(factory=lambda: Policy(cluster=CLUSTER))
    now: float = NOW
    state: PlannerState = attrs.field(factory=lambda: PlannerState.initial("i0"))
    view: FactView = attrs.field(factory=FactView)
    facts: list[CommittedFact] = attrs.field(factory=list)
    # The view's own host table by default, so plans read the indexes it keeps as hosts and facts change (the
    # property tests pass plain dicts, the other way in).
    hosts: MutableMapping[str, HostState] = attrs.field(
        default=attrs.Factory(lambda self: self.view.hosts, takes_self=True)
    )
    machine_counter: int = 0
    #: The op book's part: each planned action (and when) until it is dropped (``drop``); the plan keeps only those
    #: the facts do not show yet.
    under_way: dict[str, tuple[Action, float]] = attrs.field(factory=dict)
    #: The providers whose plugins launch all or nothing (``Catalog.gang``).
    gang: frozenset[str] = frozenset()

    def commit(self, fact: Fact) -> None:
        committed = CommittedFact(len(self.facts) + 1, fact)
        self.facts.append(committed)
        self.view.apply(committed)

    @property
    def in_flight(self) -> InFlight:
        return InFlight.of(self.under_way.values())

    def plan(self, snap: DemandSnapshot | None) -> Plan:
        offers: list[Offer] | Catalog = self.offers
        if self.gang:
            p = self.policy
            offers = Catalog(self.offers, p.priorities, p.template_priorities, p.unverified, self.gang)
        result = plan(self.state, snap, self.view, offers, self.hosts, self.now, self.policy, in_flight=self.in_flight)
        self.state = result.state
        self.under_way.update((a.op_id, (a, self.now)) for a in result.actions)
        return result

    def drop(self, op_id: str, *, unacknowledged: bool = False) -> None:
        """The action's call dropped it (``ActionDropped``): no longer in flight; an unacknowledged request leaves
        the step window."""
        action, planned_at = self.under_way.pop(op_id)
        request = PendingRequest.of(action, planned_at) if isinstance(action, RequestMachines) else None
        self.state = observe(self.state, ActionDropped(op_id, unacknowledged, request), self.policy).state

    def commit_actions(self, actions: Iterable[Action]) -> None:
        """The gate's part: commit the fact each action calls for (no provider call)."""
        for action in actions:
            match action:
                case RequestMachines():
                    refs = tuple(f"{action.op_id}/{i}" for i in range(action.count))
                    self.commit(
                        RequestIntent(
                            action.provider,
                            EPOCH,
                            action.op_id,
                            action.template_id,
                            action.count,
                            refs,
                            tuple(token_hash(r) for r in refs),
                            action.demand_id,
                            action.reservation,
                            action.release,
                            action.price,
                            action.all_or_nothing,
                        )
                    )
                case ReturnMachines():
                    self.commit(ReturnIntent(action.provider, EPOCH, action.op_id, action.machine_ids, action.reason))
                case MarkLost():
                    self.commit(Lost(action.provider, EPOCH, action.op_id, action.machine_id, action.reason))
                case FailRequest():
                    self.commit(RequestFailed(action.provider, EPOCH, action.op_id, action.reason))
                case DrainMachines():
                    self.commit(
                        DrainRequested(
                            action.provider, EPOCH, action.op_id, action.machine_ids, action.reason, action.at
                        )
                    )

    def fulfil(self, op_id: str, count: int | None = None, *, launch: float | None = None) -> list[str]:
        """The provider created ``count`` (default: all outstanding) machines for ``op_id``: commit their facts."""
        record = self.view.intents[op_id]
        intent = record.intent
        n = record.outstanding if count is None else count
        made = []
        for i in range(len(record.machine_ids), len(record.machine_ids) + n):
            self.machine_counter += 1
            machine_id = f"m{self.machine_counter:05d}"
            ref = intent.instance_refs[i]
            self.commit(
                InstanceFact(
                    intent.provider,
                    EPOCH,
                    op_id,
                    ref,
                    machine_id,
                    intent.template_id,
                    intent.token_hashes[i],
                    launch_time=self.now if launch is None else launch,
                )
            )
            made.append(machine_id)
        return made

    def host(self, machine_id: str, status: HostStatus, since: float | None = None) -> None:
        """The machine's host, ``status`` since ``since``, reporting what its template declares (a healthy agent)."""
        machine = self.view.machines[machine_id]
        template = next(
            (o for o in self.offers if (o.provider, o.template_id) == (machine.provider, machine.template_id)), None
        )
        self.hosts[machine.instance_ref] = HostState(
            machine.instance_ref,
            machine.provider,
            machine_id,
            status,
            self.now if since is None else since,
            capabilities={} if template is None else confirming_report(template),
        )

    def returned(self, action: ReturnMachines) -> None:
        self.commit(Returned(action.provider, EPOCH, action.op_id, action.machine_ids))
        for machine_id in action.machine_ids:
            self.hosts.pop(self.view.machines[machine_id].instance_ref, None)

    def active(self, demand_id: str | None = None) -> list[str]:
        return sorted(
            m.machine_id
            for m in self.view.machines.values()
            if m.state.value == "active" and (demand_id is None or m.demand_id == demand_id)
        )


def fuzz_settings(max_examples: int, **kwargs):
    """Deterministic hypothesis settings for CI; ``RECONCILE_FUZZ=N`` runs N random examples instead (a deep run)."""
    import os

    from hypothesis import settings

    deep = int(os.environ.get("RECONCILE_FUZZ", "0") or 0)
    if deep:
        return settings(max_examples=deep, deadline=None, derandomize=False, database=None, **kwargs)
    return settings(max_examples=max_examples, deadline=None, derandomize=True, **kwargs)
