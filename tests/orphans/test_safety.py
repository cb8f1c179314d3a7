"""Rate cap, circuit breaker, unreadable views, ghost confirmation and adoption."""

import attrs
from orphan_world import NOW, World, only, owner_tags, run

from provisionerd.domain.model import Epoch, HostStatus, OrphanAdopted, OrphanReported
from provisionerd.orphans.classify import ClassifierMemory, OrphanPolicy, Unreadable

CALM = OrphanPolicy(breaker_min_orphans=1000)  # keep the share trip out of tests about something else


def never_joined_world(n: int) -> World:
    world = World()
    for i in range(n):
        world.instance(f"m{i}", f"op-{i}").listed(f"m{i}", tags=owner_tags(f"op-{i}"))
    return world


# --- rate cap --------------------------------------------------------------------------------------------------


def test_rate_cap_allows_the_first_n_cleanups_in_finding_order():
    world = never_joined_world(5).listed("unknown")  # a report is not a cleanup: never capped
    result = run(world.observe(), attrs.evolve(CALM, max_cleanup_per_interval=2))
    assert [(a.kind, a.machine_id) for a in result.allowed] == [
        ("return", "m0"),
        ("return", "m1"),
        ("report", "unknown"),
    ]
    assert [f.blocked_by for f in result.findings if f.action == "return"] == [(), (), ("rate_cap",)] + [
        ("rate_cap",)
    ] * 2


def test_rate_cap_counts_only_cleanups_nothing_else_blocks():
    world = never_joined_world(3)
    world.listing[0] = attrs.evolve(world.listing[0], tags=owner_tags("op-0", **{"provisionerd:protect": "y"}))
    result = run(world.observe(), attrs.evolve(CALM, max_cleanup_per_interval=1))
    assert {f.machine_id: f.blocked_by for f in result.findings} == {
        "m0": ("protected",),
        "m1": (),
        "m2": ("rate_cap",),
    }


def test_dry_run_still_shows_which_actions_the_cap_would_defer():
    result = run(never_joined_world(3).observe(), attrs.evolve(CALM, max_cleanup_per_interval=2, dry_run=True))
    assert [f.blocked_by for f in result.findings] == [("dry_run",), ("dry_run",), ("rate_cap", "dry_run")]
    assert result.allowed == ()


# --- circuit breaker -------------------------------------------------------------------------------------------


def test_breaker_opens_after_consecutive_failed_cleanups_and_a_success_closes_it():
    world = never_joined_world(1)
    memory = ClassifierMemory()
    for _ in range(2):
        memory = memory.after_cleanup(False)
        assert run(world.observe(), CALM, memory).allowed != ()
    memory = memory.after_cleanup(False)
    blocked = run(world.observe(), CALM, memory)
    assert blocked.breaker.open and blocked.breaker.reasons == ("failed_cleanups",)
    assert only(blocked, "m0").blocked_by == ("breaker_open",)
    assert blocked.memory.failed_cleanups == 3  # the pass keeps the count
    assert run(world.observe(), CALM, memory.reset_breaker()).allowed != ()
    assert memory.after_cleanup(True).failed_cleanups == 0


def test_breaker_trips_when_too_many_machines_look_orphaned_at_once():
    world = World()
    for i in range(5):
        world.listed(f"leak{i}")
    world.instance("ok", "op-ok").listed("ok").host(machine_id="ok")
    policy = OrphanPolicy(orphan_action="terminate")  # share 0.5, min 3: 5 of 6 trips it
    result = run(world.observe(), policy)
    assert result.breaker.open and result.breaker.reasons == ("orphan_share",)
    assert (result.breaker.suspects, result.breaker.known) == (5, 6)
    assert all(f.blocked_by == ("breaker_open",) for f in result.findings)
    assert result.allowed == ()


def test_breaker_share_needs_more_than_the_minimum_count():
    world = World()
    for i in range(3):
        world.listed(f"leak{i}")
    result = run(world.observe(), OrphanPolicy(orphan_action="terminate"))  # 3 of 3, but not more than 3
    assert not result.breaker.open and len(result.allowed) == 3


def test_breaker_does_not_stop_reports():
    world = World()
    for i in range(6):
        world.listed(f"leak{i}")
    result = run(world.observe())
    assert result.breaker.open and [a.kind for a in result.allowed] == ["report"] * 6


def test_machines_already_reported_no_longer_hold_the_breaker_open_for_a_ghost():
    # After a store loss: 4 machines lost their facts and were reported; a fifth, with a fact, vanished from the
    # listing (a ghost). 5 of 9 look orphaned, but the 4 reported ones are explained by their OrphanReported facts.
    world = World()
    for i in range(4):
        world.listed(f"lost{i}")
        world.fact(OrphanReported("sim", Epoch(4, 2), f"o{i}", f"lost{i}", "tagged_unknown", "{}"))
    for i in range(4):
        world.instance(f"ok{i}", f"op-{i}").listed(f"ok{i}").host(machine_id=f"ok{i}")
    world.instance("gone", "op-gone").host(machine_id="gone", status=HostStatus.LOST)
    memory = ClassifierMemory(ghost_misses={"gone": 5})
    result = run(world.observe(), OrphanPolicy(), memory)
    assert (result.breaker.open, result.breaker.suspects) == (False, 1)
    assert [(a.kind, a.machine_id) for a in result.allowed] == [("retire", "gone")]
    # Not yet reported, the same four hold it open, and the ghost stays.
    unreported = World()
    for i in range(4):
        unreported.listed(f"lost{i}")
    for i in range(4):
        unreported.instance(f"ok{i}", f"op-{i}").listed(f"ok{i}").host(machine_id=f"ok{i}")
    unreported.instance("gone", "op-gone").host(machine_id="gone", status=HostStatus.LOST)
    blocked = run(unreported.observe(), OrphanPolicy(), memory)
    assert (blocked.breaker.open, blocked.breaker.suspects) == (True, 5)
    assert "retire" not in [a.kind for a in blocked.allowed]


def test_an_empty_listing_never_retires_every_fact():
    # The classic accident: a listing that comes back empty (wrong filter, wrong account) looks like all ghosts.
    world = World()
    for i in range(10):
        world.instance(f"m{i}", f"op-{i}").host(machine_id=f"m{i}", status=HostStatus.LOST)
    memory = ClassifierMemory(ghost_misses={f"m{i}": 5 for i in range(10)})
    result = run(world.observe(listing=()), OrphanPolicy(), memory)
    assert result.breaker.open and result.allowed == ()
    assert {f.blocked_by for f in result.findings} == {("breaker_open",)}


# --- unreadable views ------------------------------------------------------------------------------------------


def mixed_world() -> World:
    world = never_joined_world(1).listed("unknown").instance("ghost", "op-g").grant("lic", 2, 0, True)
    return world.host(machine_id="ghost", status=HostStatus.LOST)  # it joined once: only a ghost, never never_joined


def test_normal_pass_acts():
    result = run(mixed_world().observe(), CALM, ClassifierMemory(ghost_misses={"ghost": 1}))
    assert {a.machine_id for a in result.allowed} == {"m0", "unknown", "ghost", "lic"}
    assert result.skipped == ()


def test_listing_unreadable_acts_on_nothing_and_trusts_no_absence():
    memory = ClassifierMemory(ghost_misses={"ghost": 1})
    result = run(mixed_world().observe(listing=Unreadable("timeout")), CALM, memory)
    assert result.allowed == () and result.skipped == ("listing_unreadable",)
    assert [(f.orphan_class, f.machine_id) for f in result.findings] == [("never_joined", "m0"), ("license", "lic")]
    assert all("listing_unreadable" in f.blocked_by for f in result.findings)
    assert result.memory.ghost_misses == {"ghost": 1}  # neither a miss nor a sighting


def test_view_unreadable_acts_on_nothing_and_classifies_no_machine():
    memory = ClassifierMemory(ghost_misses={"ghost": 1})
    result = run(mixed_world().observe(view=Unreadable("resync failed")), CALM, memory)
    assert result.allowed == () and result.skipped == ("view_unreadable",)
    assert [(f.orphan_class, f.blocked_by) for f in result.findings] == [("license", ("view_unreadable",))]
    assert result.memory.ghost_misses == {"ghost": 1}


def test_both_unreadable():
    result = run(mixed_world().observe(listing=Unreadable(), view=Unreadable()), CALM)
    assert result.allowed == () and result.skipped == ("listing_unreadable", "view_unreadable")
    assert [f.blocked_by for f in result.findings] == [("listing_unreadable", "view_unreadable")]


# --- ghosts ----------------------------------------------------------------------------------------------------


def test_ghost_needs_two_consecutive_misses_and_a_reappearance_resets_the_count():
    world = World().instance("g", "op-g").host(machine_id="g", status=HostStatus.LOST)
    missing = world.observe()
    present = world.observe(listing=World().listed("g").listing)

    first = run(missing)
    assert only(first, "g").blocked_by == ("ghost_unconfirmed",) and first.memory.ghost_misses == {"g": 1}
    back = run(present, memory=first.memory)
    assert back.findings == () and back.memory.ghost_misses == {}
    again = run(missing, memory=back.memory)
    assert only(again, "g").blocked_by == ("ghost_unconfirmed",)
    confirmed = run(missing, memory=again.memory)
    assert only(confirmed, "g").blocked_by == () and only(confirmed, "g").evidence["not_found_reads"] == 2
    assert [a.kind for a in confirmed.allowed] == ["retire"]


def test_listed_untagged_or_terminated_machine():
    world = World().instance("untagged", "op-1").instance("dead", "op-2")
    listing = World().listed("untagged", tags={}).listed("dead", status="terminated").listing
    result = run(world.observe(listing=listing))
    # A listed machine is present whatever its tags (no ghost, and untagged so no other finding);
    # a terminated one is gone.
    assert [(f.orphan_class, f.machine_id) for f in result.findings] == [("ghost", "dead")]


def test_ghost_memory_forgets_retired_facts():
    world = World().instance("g", "op-g")
    first = run(world.observe())
    from provisionerd.domain.model import Lost

    world.fact(Lost("sim", Epoch(4, 2), "l", "g", "ghost"))
    assert run(world.observe(), memory=first.memory).memory.ghost_misses == {}


# --- adoption --------------------------------------------------------------------------------------------------


def test_adopt_by_hostname():
    world = World().listed("m1", name="node-1", address="10.0.0.1").host(hostname="node-1", instance_ref="r1")
    result = run(world.observe(), OrphanPolicy(orphan_action="terminate"))
    finding = only(result, "m1")
    assert (finding.orphan_class, finding.action, finding.blocked_by) == ("tagged_unknown", "adopt", ())
    assert finding.evidence["matching_host"]["hostname"] == "node-1"
    [action] = result.allowed
    fact = action.fact()
    assert isinstance(fact, OrphanAdopted)
    assert (fact.machine_id, fact.hostname, fact.instance_ref, fact.epoch) == ("m1", "node-1", "r1", Epoch(4, 2))


def test_adopt_by_address():
    world = World().listed("m1", name="ip-10-0-0-9", address="10.0.0.9").host(hostname="node-9", address="10.0.0.9")
    finding = only(run(world.observe(), OrphanPolicy(orphan_action="terminate")), "m1")
    assert (finding.action, finding.blocked_by) == ("adopt", ())
    assert finding.evidence["matching_host"]["address"] == "10.0.0.9"


def test_adoption_is_not_held_back_by_the_grace():
    world = World().listed("m1", launch=NOW - 5, name="n1").host(hostname="n1")
    assert only(run(world.observe(), OrphanPolicy(orphan_action="terminate")), "m1").blocked_by == ()


def test_lost_host_is_not_a_match():
    world = World().listed("m1", name="n1").host(hostname="n1", status=HostStatus.LOST)
    assert only(run(world.observe()), "m1").action == "report"


def test_host_of_another_tracked_machine_is_not_a_match():
    # A new machine reusing the address of a busy tracked host must not be adopted onto it, nor terminated.
    world = World().instance("tracked", "op-1", address="10.0.0.5").listed("tracked", address="10.0.0.5")
    world.host(machine_id="tracked", instance_ref="op-1-ref0", address="10.0.0.5", status=HostStatus.BUSY)
    world.listed("newcomer", address="10.0.0.5")
    result = run(world.observe(), OrphanPolicy(orphan_action="terminate"))
    assert [(f.machine_id, f.action) for f in result.findings] == [("newcomer", "terminate")]
    assert only(result, "newcomer").evidence["matching_host"] is None


def test_adopted_machine_is_no_longer_an_orphan():
    world = World().listed("m1", name="n1").host(hostname="n1")
    world.fact(OrphanAdopted("sim", Epoch(4, 2), "a1", "m1", "r1", "n1", ""))
    assert run(world.observe()).findings == ()


def test_a_listing_that_contradicts_itself_is_read_the_safe_way():
    # Found by hypothesis: duplicated ids with different tags.
    world = World().listed("dup", name="n").listed("dup", name="n", tags=owner_tags(**{"provisionerd:protect": ""}))
    world.listed("half").listed("half", tags={})
    world.host(hostname="n")
    result = run(world.observe(), OrphanPolicy(orphan_action="terminate"))
    assert [(f.machine_id, f.action, f.blocked_by) for f in result.findings] == [("dup", "adopt", ("protected",))]


def test_a_protect_tag_on_a_terminated_copy_still_protects_the_live_one():
    # Found by hypothesis (test_allowed_actions_respect_every_gate): the same id listed as terminated with the
    # protect tag and as running without it was adopted. Any copy's protect tag protects the machine.
    protect = owner_tags(**{"provisionerd:protect": ""})
    world = World().listed("dup", name="n", status="terminated", tags=protect).listed("dup", name="n")
    world.host(hostname="n")
    result = run(world.observe(), OrphanPolicy(orphan_action="terminate"))
    assert [(f.machine_id, f.action, f.blocked_by) for f in result.findings] == [("dup", "adopt", ("protected",))]
    assert result.allowed == ()


def test_more_ghost_confirmations_wait_longer():
    world = World().instance("g", "op-g").host(machine_id="g", status=HostStatus.LOST)
    policy = OrphanPolicy(ghost_confirmations=3)
    memory = ClassifierMemory()
    for expected in (("ghost_unconfirmed",), ("ghost_unconfirmed",), ()):
        result = run(world.observe(), policy, memory)
        assert only(result, "g").blocked_by == expected
        memory = result.memory
