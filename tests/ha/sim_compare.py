"""The simulation's controller model against the real runs of tests/ha, where they overlap (issue 22).

A real test (processes, etcd, namespaces, the real clock) and the simulation (``provisionerd.testing.simulation``:
the same refcontroller ``Cluster`` and daemon code in one process on a virtual clock and network) are given **the
same fault plan**, written once here as a ``FaultPlan``; each run is reduced to the same small ``Outcome`` (who holds
the lease when, relative to the rules), and the test asserts the two are equal. How the fault maps:

- ``twin`` of slot a: the second daemon, same identity and provider, its own state (B, the standby);
- ``failover``: kill -9 of the primary replica process (the sim's model of a primary's death: a new term, an empty
  lease table with its grace, every session of the old primary cut);
- ``kill`` of slot a: kill -9 of daemon A;
- ``partition`` of slot a, both directions, drop: A cut from the primary (the real A still reaches the standbys,
  which redirect it to the primary it cannot reach; the sim cuts the slot from every replica: the same for A).

Timings are not compared (the real election takes the claim's etcd lease, ~2 s; the sim's failover is instant):
the outcome is what the rules decide. The simulation keeps the work the real runs cannot do: thousands of seeded
plans, every interleaving the seed draws, invariants checked at every step (docs/ha.md, "Real runs and the
simulation").
"""

from __future__ import annotations

import json

import attrs

from provisionerd.domain.model import Epoch
from provisionerd.testing.simulation.faults import Fault, FaultPlan
from provisionerd.testing.simulation.runner import run_world
from provisionerd.testing.simulation.world import World

#: The fault plans (virtual seconds); the real tests apply the same faults in the same order.
TWIN_AT, FAULT_AT = 10.0, 30.0


def grace_plan(holder_killed: bool) -> FaultPlan:
    faults = [Fault(TWIN_AT, "twin", 60.0, "a", mode="kill"), Fault(FAULT_AT, "failover", value=1.0)]
    if holder_killed:
        faults.append(Fault(FAULT_AT, "kill", 40.0, "a"))
    return FaultPlan(tuple(faults))


def partition_plan() -> FaultPlan:
    return FaultPlan(
        (Fault(TWIN_AT, "twin", 60.0, "a", mode="kill"), Fault(FAULT_AT, "partition", 20.0, "a", "both", "drop"))
    )


@attrs.frozen
class GraceOutcome:
    """After the primary's death: who was granted first in the new term, whether inside the grace, whether anyone
    but the last grantee was granted before the grace ended, whether the standby held it in the new term."""

    first: str  # "holder" | "standby"
    first_inside_grace: bool
    other_inside_grace: bool
    standby_held: bool


@attrs.frozen
class PartitionOutcome:
    """After A is cut from the primary: whether A's lease lapsed on its own clock before the standby's grant, in
    the same term; provider mutations between the lapse and the grant; A's mutations after its lapse."""

    standby_granted: bool
    lapse_before_grant: bool
    same_term: bool
    mutations_between: int
    holder_mutations_after_lapse: int


def _grace_outcome(grants: list[tuple[float, str]], holder: str, grace_ends: float, window_end: float) -> GraceOutcome:
    """``grants``: (time, "holder"|"standby") of each new (not renewed) grant of the new term, in order."""
    first_at, first = grants[0]
    return GraceOutcome(
        first=first,
        first_inside_grace=first_at < grace_ends,
        other_inside_grace=any(who != holder and at < grace_ends for at, who in grants),
        standby_held=any(who == "standby" and at <= window_end for at, who in grants),
    )


# --- the simulation ---------------------------------------------------------------------------------------------


def sim_world(plan: FaultPlan, seed: int = 1) -> World:
    """The sim with the real tests' settings: TTL 4 s, T_check 1 s, margin 0.5 s, heartbeats 0.3 s / 1.5 s."""
    return World(
        seed,
        plan=plan,
        keep_trace=True,
        workload="gate",
        slots=("a",),
        ttl=4.0,
        check_interval=1.0,
        margin=0.5,
        heartbeat_interval=0.3,
        heartbeat_timeout=1.5,
        settle=10.0,
    )


def _trace(world: World) -> list[tuple[float, str, str, dict]]:
    out = []
    for line in world.recorder.trace:
        at, actor, event, fields = line.split(" ", 3)
        out.append((float(at), actor, event, json.loads(fields)))
    return out


def _who(holder: str) -> str:
    return "standby" if "#a.twin-" in holder else "holder"


def sim_grace_outcome(holder_killed: bool) -> GraceOutcome:
    world = sim_world(grace_plan(holder_killed))
    result = run_world(world)
    assert result.ok, result.violations
    s = world.settings
    grace_ends = FAULT_AT + s.ttl + s.check_interval
    grants = [
        (at, _who(f["holder"]))
        for at, actor, event, f in _trace(world)
        if actor == "controller" and event == "lease_grant" and not f["renewal"] and at >= FAULT_AT
    ]
    return _grace_outcome(grants, "holder", grace_ends, float("inf"))


def sim_partition_outcome() -> PartitionOutcome:
    world = sim_world(partition_plan())
    result = run_world(world)
    assert result.ok, result.violations
    trace = _trace(world)
    lapse = next(at for at, actor, event, _ in trace if actor == "a#1" and event == "lease_lost" and at >= FAULT_AT)
    grant_at, grant = next(
        (at, f)
        for at, actor, event, f in trace
        if actor == "controller" and event == "lease_grant" and not f["renewal"] and at >= FAULT_AT
    )
    held_before = [
        f["epoch"]
        for at, actor, event, f in trace
        if actor == "controller" and event == "lease_grant" and at < FAULT_AT
    ]
    mutations = [(at, f["caller"]) for at, actor, event, f in trace if actor == "provider" and event == "mutation"]
    return PartitionOutcome(
        standby_granted=_who(grant["holder"]) == "standby",
        lapse_before_grant=lapse < grant_at,
        same_term=Epoch.parse(grant["epoch"]).term == Epoch.parse(held_before[-1]).term,
        mutations_between=sum(1 for at, _ in mutations if lapse <= at <= grant_at),
        holder_mutations_after_lapse=sum(1 for at, who in mutations if who == "a#1" and lapse <= at < FAULT_AT + 20.0),
    )


# --- the real runs (the daemons' events files) --------------------------------------------------------------------


def real_grace_outcome(
    a_events: list[dict], b_events: list[dict], new_term: int, grace_ends: float, window_end: float
) -> GraceOutcome:
    grants = []
    for who, events in (("holder", a_events), ("standby", b_events)):
        # A daemon's first grant of the new term (a holder that was still holding may log it as a renewal).
        first = [
            e["ts"]
            for e in events
            if e["event"] in ("lease_acquired", "lease_renewed") and Epoch.parse(e["epoch"]).term == new_term
        ]
        if first:
            grants.append((first[0], who))
    grants.sort()
    return _grace_outcome(grants, "holder", grace_ends, window_end)


def real_partition_outcome(
    a_events: list[dict], b_events: list[dict], cut_at: float, grant_at: float, healed_at: float
) -> PartitionOutcome:
    lapse = next(e for e in a_events if e["event"] == "lease_lost" and e["ts"] > cut_at)
    acquired = next(e for e in b_events if e["event"] == "lease_acquired")
    before = [e for e in a_events if e["event"] in ("lease_acquired", "lease_renewed") and e["ts"] < cut_at]

    def calls(events: list[dict]) -> list[float]:
        return [e["ts"] for e in events if e["event"] == "action" and e.get("phase") == "called"]

    return PartitionOutcome(
        standby_granted=True,
        lapse_before_grant=lapse["ts"] < grant_at,
        same_term=Epoch.parse(acquired["epoch"]).term == Epoch.parse(before[-1]["epoch"]).term,
        mutations_between=sum(1 for t in calls(a_events) + calls(b_events) if lapse["ts"] <= t <= grant_at),
        holder_mutations_after_lapse=sum(1 for t in calls(a_events) if lapse["ts"] <= t < healed_at),
    )
