"""Each precondition alone blocks the action, and names itself.

Every case starts from a pass in which one finding's action is allowed, flips exactly one precondition, and checks
that the same finding (same class, machine and action) is now blocked by that name and nothing else, and that it
left the allowed actions. Evidence may differ only where the flip itself changes it (listed per case).
"""

import attrs
import pytest
from orphan_world import NOW, World, only, owner_tags, run

from provisionerd.domain.model import NO_EPOCH, Epoch, HostStatus, OrphanReported
from provisionerd.orphans.classify import ClassifierMemory, ControllerState, LeaseState, OrphanPolicy, Unreadable
from provisionerd.orphans.model import ListingAbsent


def never_joined():
    world = World().instance("m1", "op-1").listed("m1", tags=owner_tags("op-1"))
    return world, "m1", OrphanPolicy(), ClassifierMemory()


def never_joined_protected():
    world = World().instance("m1", "op-1").listed("m1", tags=owner_tags("op-1", **{"provisionerd:protect": "yes"}))
    return world, "m1", OrphanPolicy(), ClassifierMemory()


def terminate(launch: float = NOW - 1801):
    world = World().listed("m2", launch=launch)
    return world, "m2", OrphanPolicy(orphan_action="terminate"), ClassifierMemory()


def ghost():
    world = World().instance("g1", "op-1")
    return world, "g1", OrphanPolicy(), ClassifierMemory(ghost_misses={"g1": 1})


def adopt():
    world = World().listed("m3", name="w3").host(hostname="w3")
    return world, "m3", OrphanPolicy(), ClassifierMemory()


def license_return():
    world = World().grant("lic", 3, 0, True)
    return world, "lic", OrphanPolicy(), ClassifierMemory()


def report():
    world = World().listed("m4")
    return world, "m4", OrphanPolicy(), ClassifierMemory()


def _ambiguous_flip(world, obs, policy, memory):
    # Two live hosts both match the machine (one by hostname, one by address): adopting either is a guess.
    extra = World().host(hostname="w3", instance_ref="r-a").host(address="10.0.0.3", instance_ref="r-b").hosts
    listing = (attrs.evolve(obs.listing[0], address="10.0.0.3"),)
    return attrs.evolve(obs, hosts=extra, listing=listing), policy, memory


# name -> (scenario, flip(world, obs, policy, memory) -> (obs, policy, memory), evidence keys the flip may change)
CASES = {
    "no_lease": (never_joined, lambda w, o, p, m: (attrs.evolve(o, lease=LeaseState()), p, m), {"epoch"}),
    "not_primary": (
        never_joined,
        lambda w, o, p, m: (attrs.evolve(o, controller=ControllerState(primary=False, settled=True)), p, m),
        set(),
    ),
    "settling": (
        ghost,
        lambda w, o, p, m: (attrs.evolve(o, controller=ControllerState(primary=True, settled=False)), p, m),
        set(),
    ),
    "protected": (
        never_joined,
        lambda w, o, p, m: (never_joined_protected()[0].observe(), p, m),
        {"tags"},
    ),
    "listing_unreadable": (
        never_joined,
        lambda w, o, p, m: (attrs.evolve(o, listing=Unreadable("timeout")), p, m),
        {"tags", "name", "status"},  # without a listing the evidence comes from the fact alone
    ),
    "listing_absent": (  # a provider without listMachines (legacy LSF): absent, and still nothing acts on it
        never_joined,
        lambda w, o, p, m: (attrs.evolve(o, listing=ListingAbsent("no listMachines")), p, m),
        {"tags", "name", "status"},
    ),
    "view_unreadable": (
        license_return,
        lambda w, o, p, m: (attrs.evolve(o, view=Unreadable("no primary")), p, m),
        set(),
    ),
    "launch_time_unknown": (
        terminate,
        lambda w, o, p, m: (terminate(launch=0.0)[0].observe(), p, m),
        {"launch_time", "age"},
    ),
    "grace": (terminate, lambda w, o, p, m: (terminate(launch=NOW - 1799)[0].observe(), p, m), {"launch_time", "age"}),
    "ghost_unconfirmed": (ghost, lambda w, o, p, m: (o, p, ClassifierMemory()), {"not_found_reads"}),
    "host_alive": (
        ghost,
        lambda w, o, p, m: (attrs.evolve(o, hosts=World().host(machine_id="g1").hosts), p, m),
        {"matching_host"},
    ),
    "ambiguous_match": (adopt, _ambiguous_flip, {"matching_host", "matching_hosts", "address"}),
    "already_reported": (
        report,
        lambda w, o, p, m: (
            w.fact(OrphanReported("sim", Epoch(4, 2), "o1", "m4", "tagged_unknown", "{}")).observe(),
            p,
            m,
        ),
        set(),
    ),
    "breaker_open": (never_joined, lambda w, o, p, m: (o, p, ClassifierMemory(failed_cleanups=3)), set()),
    "rate_cap": (ghost, lambda w, o, p, m: (o, attrs.evolve(p, max_cleanup_per_interval=0), m), set()),
    "dry_run": (adopt, lambda w, o, p, m: (o, attrs.evolve(p, dry_run=True), m), set()),
}


def test_every_blocker_has_a_case():
    from provisionerd.orphans.classify import BLOCKERS

    assert set(CASES) == set(BLOCKERS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_precondition_alone_blocks_the_action(name):
    scenario, flip, may_change = CASES[name]
    world, machine_id, policy, memory = scenario()
    obs = world.observe()
    before = run(obs, policy, memory)
    base = only(before, machine_id)
    assert base.blocked_by == () and base.allowed, base
    assert machine_id in [a.machine_id for a in before.allowed]

    after = run(*flip(world, obs, policy, memory))
    flipped = only(after, machine_id)
    assert flipped.blocked_by == (name,)
    assert (flipped.orphan_class, flipped.action) == (base.orphan_class, base.action)
    unchanged = set(base.evidence) - may_change
    assert {k: flipped.evidence.get(k) for k in unchanged} == {k: base.evidence[k] for k in unchanged}
    assert machine_id not in [a.machine_id for a in after.allowed]


@pytest.mark.parametrize("lease", [LeaseState(False, Epoch(4, 2)), LeaseState(True, None), LeaseState(True, NO_EPOCH)])
def test_no_epoch_to_stamp_blocks_like_no_lease(lease):
    world, machine_id, policy, memory = never_joined()
    result = run(world.observe(lease=lease), policy, memory)
    assert only(result, machine_id).blocked_by == ("no_lease",)
    assert only(result, machine_id).evidence["epoch"] is None
    assert result.allowed == ()


def test_protected_machine_is_still_reported():
    world = World().listed("m1", tags=owner_tags(**{"provisionerd:protect": ""}))
    result = run(world.observe())
    assert only(result, "m1").action == "report" and only(result, "m1").blocked_by == ()
    for action in ("stop", "terminate"):
        finding = only(run(world.observe(), OrphanPolicy(orphan_action=action)), "m1")
        assert finding.blocked_by == ("protected",)


def test_protected_machine_matching_a_host_is_not_adopted():
    world = World().listed("m1", name="w1", tags=owner_tags(**{"provisionerd:protect": "1"})).host(hostname="w1")
    finding = only(run(world.observe()), "m1")
    assert (finding.action, finding.blocked_by) == ("adopt", ("protected",))


def test_custom_protect_tag():
    world = World().listed("m1", tags=owner_tags(keep="me"))
    policy = OrphanPolicy(orphan_action="terminate", protect_tag="keep")
    assert only(run(world.observe(), policy), "m1").blocked_by == ("protected",)
    assert only(run(world.observe(), OrphanPolicy(orphan_action="terminate")), "m1").blocked_by == ()


def test_several_blockers_are_all_named_in_canonical_order():
    world, machine_id, policy, _ = never_joined()
    obs = world.observe(lease=LeaseState(), controller=ControllerState(primary=False, settled=False))
    result = run(obs, attrs.evolve(policy, dry_run=True), ClassifierMemory(failed_cleanups=9))
    assert only(result, machine_id).blocked_by == ("no_lease", "not_primary", "settling", "breaker_open", "dry_run")


def test_lost_host_does_not_keep_a_ghost_alive():
    world, machine_id, policy, memory = ghost()
    world.host(machine_id="g1", status=HostStatus.LOST)
    assert only(run(world.observe(), policy, memory), machine_id).blocked_by == ()
