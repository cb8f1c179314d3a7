"""Hypothesis properties of the classifier over arbitrary worlds.

The worlds mix owned, foreign, half-tagged, duplicated and protected machines, facts in every state, hosts that
match by every key (or several at once), grants, unreadable views, any lease and controller state, and any valid
policy and memory.
"""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from orphan_world import CLUSTER, EPOCH, NOW, PROVIDER

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    CommittedFact,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    ProviderMachine,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.orphans.classify import (
    ClassifierMemory,
    ControllerState,
    CountedResource,
    LeaseState,
    Observation,
    OrphanPolicy,
    Unreadable,
    classify,
)
from provisionerd.orphans.model import CLEANUP_ACTIONS, PROTECTED_ACTIONS
from provisionerd.orphans.report import render_json, render_table
from provisionerd.planner.fact_view import fold

IDS = [f"m{i}" for i in range(8)]
OPS = [f"op{i}" for i in range(4)]
REFS = [f"r{i}" for i in range(4)]
NAMES = ["", "n0", "n1", "n2"]
ADDRS = ["", "10.0.0.1", "10.0.0.2"]
PROVIDERS = [PROVIDER, "other"]
PROTECT = "provisionerd:protect"
times = st.sampled_from([0.0, NOW - 5000, NOW - 1850, NOW - 950, NOW - 100, NOW + 100, math.nan, math.inf, -1.0])


def _fact(draw, kind, provider, op, mid):
    """One fact of ``kind``: only the chosen constructor runs, so only its draws are made."""
    e = EPOCH
    return {
        "intent": lambda: RequestIntent(provider, e, op, "t", 2, ("a", "b"), ("0" * 64,) * 2),
        "instance": lambda: InstanceFact(
            provider,
            e,
            op,
            draw(st.sampled_from(REFS)),
            mid,
            "t",
            "0" * 64,
            draw(st.sampled_from(NAMES)),
            draw(st.sampled_from(ADDRS)),
            draw(times),
        ),
        "failed": lambda: RequestFailed(provider, e, op, "x"),
        "return": lambda: ReturnIntent(provider, e, "ret-" + op, (mid,), "idle"),
        "returned": lambda: Returned(provider, e, "ret-" + op, (mid,)),
        "lost": lambda: Lost(provider, e, "lost-" + op, mid, "gone"),
        "reported": lambda: OrphanReported(
            provider, e, "rep", mid, draw(st.sampled_from(["tagged_unknown", "license"])), "{}"
        ),
        "adopted": lambda: OrphanAdopted(provider, e, "ad", mid, draw(st.sampled_from(REFS))),
    }[kind]()


@st.composite
def facts(draw):
    out = []
    for _ in range(draw(st.integers(0, 14))):
        provider = draw(st.sampled_from(PROVIDERS))
        op, mid = draw(st.sampled_from(OPS)), draw(st.sampled_from(IDS))
        kind = draw(
            st.sampled_from(
                ["intent", "instance", "instance", "failed", "return", "returned", "lost", "reported", "adopted"]
            )
        )
        fact = _fact(draw, kind, provider, op, mid)
        out.append(CommittedFact(len(out) + 1, fact))
    return out


@st.composite
def machine(draw):
    tags = {}
    # Mostly owned (both tags right), so that the interesting paths run; sometimes half-tagged or foreign.
    choices = (
        (TAG_CLUSTER, [CLUSTER] * 5 + ["clu-other", None]),
        (TAG_PROVIDER, [PROVIDER] * 5 + ["other", None]),
        (TAG_OP, OPS + [None]),
        (TAG_INSTANCE, REFS + [None]),
        (PROTECT, ["", "yes"] + [None] * 4),
    )
    for key, values in choices:
        value = draw(st.sampled_from(values))
        if value is not None:
            tags[key] = value
    return ProviderMachine(
        machine_id=draw(st.sampled_from(IDS)),
        name=draw(st.sampled_from(NAMES)),
        status=draw(st.sampled_from(["running", "running", "stopped", "terminated", "pending"])),
        launch_time=draw(times),
        address=draw(st.sampled_from(ADDRS)),
        tags=tags,
    )


hosts = st.builds(
    HostState,
    instance_ref=st.sampled_from([""] + REFS),
    provider=st.sampled_from(PROVIDERS),
    machine_id=st.sampled_from([""] + IDS),
    status=st.sampled_from(list(HostStatus)),
    since=st.just(NOW),
    hostname=st.sampled_from(NAMES),
    address=st.sampled_from(ADDRS),
)
licenses = st.builds(
    CountedResource,
    st.sampled_from(["lic-a", "lic-b"]),
    st.integers(0, 3),
    st.none() | st.integers(0, 3),
    st.booleans(),
    provider_in_use=st.none() | st.integers(0, 3),
    checked_out=st.sampled_from([0.0, NOW - 10, NOW - 4000]),
)
policies = st.builds(
    OrphanPolicy,
    orphan_action=st.sampled_from(["report", "stop", "terminate"]),
    join_deadline=st.sampled_from([1.0, 900.0]),
    orphan_grace=st.sampled_from([0.0, 1800.0]),
    max_cleanup_per_interval=st.integers(0, 4),
    breaker_max_failures=st.integers(1, 3),
    breaker_max_share=st.sampled_from([0.1, 0.5, 1.0]),
    breaker_min_orphans=st.sampled_from([0, 3, 100, 100]),
    protect_tag=st.just(PROTECT),
    dry_run=st.sampled_from([False, False, False, True]),
)
memories = st.builds(
    ClassifierMemory,
    st.dictionaries(st.sampled_from(IDS), st.integers(1, 3), max_size=6),
    st.sampled_from([0, 0, 0, 1, 2, 4]),
)


@st.composite
def observations(draw):
    listing = tuple(draw(st.lists(machine(), max_size=10)))
    view = fold(draw(facts()))
    return Observation(
        cluster_id=CLUSTER,
        provider=PROVIDER,
        now=NOW,
        listing=Unreadable("x") if draw(st.integers(0, 9)) == 0 else listing,
        view=Unreadable("y") if draw(st.integers(0, 9)) == 0 else view,
        hosts=tuple(draw(st.lists(hosts, max_size=6))),
        licenses=tuple(draw(st.lists(licenses, max_size=2))),
        lease=draw(st.sampled_from([LeaseState(True, EPOCH)] * 4 + [LeaseState(), LeaseState(True, None)])),
        controller=draw(
            st.sampled_from(
                [ControllerState(True, True)] * 4 + [ControllerState(False, True), ControllerState(True, False)]
            )
        ),
    )


def untouchable_ids(obs):
    """Listed ids with a live copy lacking this cluster's id tag or this provider's tag."""
    if isinstance(obs.listing, Unreadable):
        return set()
    return {
        m.machine_id
        for m in obs.listing
        if m.status != "terminated" and (m.tags.get(TAG_CLUSTER) != CLUSTER or m.tags.get(TAG_PROVIDER) != PROVIDER)
    }


@settings(max_examples=150, deadline=None)
@given(observations(), policies, memories)
def test_untagged_machines_are_never_findings_nor_targets(obs, policy, memory):
    result = classify(obs, policy, memory)
    untouchable = untouchable_ids(obs)
    assert not {f.machine_id for f in result.findings} & untouchable
    assert not {a.machine_id for a in result.allowed} & untouchable
    if not isinstance(obs.listing, Unreadable):
        owned = {m.machine_id for m in obs.listing if m.status != "terminated"} - untouchable
        for finding in result.findings:
            if finding.orphan_class in ("never_joined", "tagged_unknown"):
                assert finding.machine_id in owned
            if finding.orphan_class == "ghost":
                assert finding.machine_id not in {m.machine_id for m in obs.listing if m.status != "terminated"}


@settings(max_examples=50, deadline=None)
@given(observations(), policies, memories)
def test_deterministic(obs, policy, memory):
    assert classify(obs, policy, memory) == classify(obs, policy, memory)


@settings(max_examples=150, deadline=None)
@given(observations(), policies, memories)
def test_allowed_actions_respect_every_gate(obs, policy, memory):
    result = classify(obs, policy, memory)
    cleanups = [a for a in result.allowed if a.kind in CLEANUP_ACTIONS]
    assert len(cleanups) <= policy.max_cleanup_per_interval
    if not obs.lease.usable or not obs.controller.primary or not obs.controller.settled:
        assert result.allowed == ()
    if policy.dry_run:
        assert result.allowed == ()
        assert all("dry_run" in f.blocked_by for f in result.findings if f.action != "none")
    if result.skipped:
        assert result.allowed == ()
    if result.breaker.open:
        assert not [a for a in result.allowed if a.kind in CLEANUP_ACTIONS | {"adopt"}]
    allowed_findings = [(f.machine_id, f.action) for f in result.findings if f.allowed]
    assert [(a.machine_id, a.kind) for a in result.allowed] == allowed_findings
    assert all(a.epoch == obs.lease.epoch for a in result.allowed)
    assert all(a.epoch != Epoch(0, 0) for a in result.allowed)
    protected = {m.machine_id for m in obs.listing if PROTECT in m.tags} if isinstance(obs.listing, tuple) else set()
    assert not [a for a in result.allowed if a.machine_id in protected and a.kind in PROTECTED_ACTIONS]


@settings(max_examples=50, deadline=None)
@given(observations(), policies, memories)
def test_reports_render(obs, policy, memory):
    findings = classify(obs, policy, memory).findings
    document = json.loads(render_json(findings))
    assert len(document["findings"]) == len(findings) and document["mutations"] == 0
    table = render_table(findings)
    assert len(table.splitlines()) == (len(findings) + 2 if findings else 1)
    for action in classify(obs, policy, memory).allowed:
        action.fact()  # every allowed action has its fact


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(0, 10),
    st.booleans(),
)
def test_rate_cap_allows_exactly_min_of_cap_and_eligible(never_joined, ghosts, strays, cap, dry_run):
    from orphan_world import World, owner_tags

    world = World()
    for i in range(never_joined):
        world.instance(f"nj{i}", f"op-nj{i}").listed(f"nj{i}", tags=owner_tags(f"op-nj{i}"))
    for i in range(ghosts):
        world.instance(f"gh{i}", f"op-gh{i}").host(machine_id=f"gh{i}", status=HostStatus.LOST)
    for i in range(strays):
        world.listed(f"st{i}")
    policy = OrphanPolicy(
        orphan_action="terminate", max_cleanup_per_interval=cap, breaker_min_orphans=1000, dry_run=dry_run
    )
    memory = ClassifierMemory(ghost_misses={f"gh{i}": 1 for i in range(ghosts)})
    result = classify(world.observe(), policy, memory)
    eligible = never_joined + ghosts + strays
    expected = 0 if dry_run else min(cap, eligible)
    assert len([a for a in result.allowed if a.kind in CLEANUP_ACTIONS]) == expected
    assert sum("rate_cap" in f.blocked_by for f in result.findings) == max(0, eligible - cap)
