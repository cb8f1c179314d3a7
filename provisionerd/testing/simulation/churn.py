"""Long churn runs (``provisionerd simulate --churn HOURS``): months of history in one run, and the checks that the
daemon's and the controller's cost follows the live fleet, not the history (issue #18, item 7).

A churn run is a ``lifecycle`` run whose demand changes every few virtual minutes for ``HOURS`` virtual hours, so
thousands of lifecycles start and end; its faults are the link's and the daemon's (kills, partitions, delays,
failovers, lost pushes), so the daemon rejoins and resyncs, incrementally where the controller can, many times.
Besides every invariant of a lifecycle run, every ``SAMPLE`` virtual seconds and at the end:

``history_unbounded``  the controller's resync set for the provider (its live facts, ``FactStore.live_count``) is
                       larger than the live state can explain (``live_bound``): ended lifecycles were not left out
``view_unbounded``     a daemon's view holds more machine records than the live state can explain: ended machines
                       (returned, lost) were kept
``view_diverged``      at the end, a daemon's view of the live state (live machines and their states, open intents,
                       open returns) is not what a full resync of the controller's log would build now

The bounds are in the provider's cap, never in the run's length: a run of a virtual week ends with the same bound
as one of an hour.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import trio

from provisionerd.planner.fact_view import FactView, fold
from provisionerd.testing.simulation.lifecycle import DemandStep

if TYPE_CHECKING:
    from provisionerd.testing.simulation.world import World

#: Virtual seconds between two looks at the resync set and the daemons' views.
SAMPLE = 600.0
#: The fault kinds of a churn run: breaks of the link and of the daemon, none of the cloud or the store.
KINDS = ("failover", "partition", "drop_pushes", "delay", "kill")
#: One fault per this many virtual seconds of churn, on average (``max_faults`` of the run).
FAULT_EVERY = 1800.0
#: Facts one live machine may account for in the resync set: its request's intent and instance fact, a return's
#: intent and confirmation, a lost fact and an orphan report (a request of n machines shares one intent).
FACTS_PER_MACHINE = 6
#: What the live state may hold besides machines: open intents of requests under way, findings, each provider's
#: latest fact.
SLACK = 40


def draw_demand(rng: random.Random, horizon: float) -> tuple[DemandStep, ...]:
    """For ``horizon`` seconds, a new level every 3 to 10 virtual minutes, high (5 to 8 machines) and low (0 to 2) in
    turn: most machines of a high level are returned at the next low one, so lifecycles keep ending."""
    steps = [DemandStep(0.0, rng.randint(5, 8))]
    at = 0.0
    while True:
        at = round(at + rng.uniform(180.0, 600.0), 3)
        if at >= horizon:
            return tuple(steps)
        high = len(steps) % 2 == 0
        steps.append(DemandStep(at, rng.randint(5, 8) if high else rng.randint(0, 2)))


def settings_for(hours: float) -> dict[str, Any]:
    """``WorldSettings`` overrides of a churn run of ``hours`` virtual hours."""
    horizon = hours * 3600.0
    return {
        "workload": "lifecycle",
        "churn": horizon,
        "horizon": horizon,
        "fault_kinds": KINDS,
        "max_faults": max(2, int(horizon // FAULT_EVERY)),
        "settle": 300.0,
    }


def live_bound(world: World) -> int:
    return FACTS_PER_MACHINE * world.settings.provider_cap + SLACK


#: Machine records a view may hold besides twice the cap: requests and returns under way at a sample.
MACHINE_SLACK = 4


def machines_bound(world: World) -> int:
    # Live machines are at most the cap; returns under way and machines the daemon has not seen end yet add at most
    # as many again.
    return 2 * world.settings.provider_cap + MACHINE_SLACK


class ChurnWatch:
    """Samples the resync set and the daemons' views while a churn run goes on."""

    def __init__(self) -> None:
        self.samples = 0
        self.max_live_facts = 0
        self.max_view_machines = 0
        self.facts_total = 0

    async def run(self, world: World, provider: str) -> None:
        while True:
            await trio.sleep(SAMPLE)
            self.sample(world, provider)

    def sample(self, world: World, provider: str) -> None:
        cluster, rec = world.cluster, world.recorder
        assert cluster is not None
        self.samples += 1
        live = cluster.store.live_count([provider])
        self.facts_total = cluster.store.count()
        self.max_live_facts = max(self.max_live_facts, live)
        if live > live_bound(world):
            rec.violate(
                "history_unbounded",
                f"{live} live facts in the resync set of {provider!r} (bound {live_bound(world)}) with"
                f" {self.facts_total} facts in the log",
            )
        for node in world.instances:
            view = _view(node)
            if view is None:
                continue
            held = len(view.machines)
            self.max_view_machines = max(self.max_view_machines, held)
            if held > machines_bound(world):
                rec.violate(
                    "view_unbounded",
                    f"{node.instance} holds {held} machine records (bound {machines_bound(world)}),"
                    f" {len(view.live_machines())} of them live",
                )

    def check_views(self, world: World, provider: str) -> None:
        """At the end: each running daemon's live state is what a full resync would give it now."""
        cluster, rec = world.cluster, world.recorder
        assert cluster is not None
        last = cluster.store.last_index()
        full = fold(cluster.store.facts([provider], 1, last, as_of=last))
        expected = live_state(full, provider)
        for node in world.instances:
            if node.scope.cancel_called:
                continue
            view = _view(node)
            if view is None or view.last_index != last:
                continue  # not caught up with the log at this instant: nothing to compare
            held = live_state(view, provider)
            if held != expected:
                rec.violate("view_diverged", f"{node.instance}: {_difference(held, expected)}"[:500])

    def summary(self) -> dict[str, int]:
        return {
            "samples": self.samples,
            "max_live_facts": self.max_live_facts,
            "max_view_machines": self.max_view_machines,
            "facts_total": self.facts_total,
        }


def live_state(view: FactView, provider: str) -> dict[str, Any]:
    """What a plan pass reads of ``view``: live machines (id -> state, instance ref), open intents, open returns."""
    return {
        "machines": {m.machine_id: (m.state.name, m.instance_ref) for m in view.live_machines(provider)},
        "intents": sorted(r.intent.op_id for r in view.open_intents(provider)),
        "returns": sorted(op for op in view.open_returns if view.returns[op].intent.provider == provider),
    }


def _difference(held: dict[str, Any], expected: dict[str, Any]) -> str:
    parts = []
    for key in ("machines", "intents", "returns"):
        a, b = held[key], expected[key]
        if a != b:
            extra = sorted(set(a) - set(b))[:5]
            missing = sorted(set(b) - set(a))[:5]
            parts.append(f"{key}: extra {extra} missing {missing}")
    return "; ".join(parts) or "states differ"


def _view(node: Any) -> FactView | None:
    session = getattr(node.core, "session", None)
    view = getattr(session, "view", None)
    return None if view is None else view.facts
