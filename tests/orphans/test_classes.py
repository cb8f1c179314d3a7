"""One test (or a few) per orphan class: what makes a finding, its class, action and evidence."""

from orphan_world import EPOCH, NOW, OLD, PROVIDER, YOUNG, World, only, owner_tags, run

from provisionerd.domain.model import Epoch, HostStatus, Lost, OrphanReported, RequestFailed, Returned, ReturnIntent
from provisionerd.orphans.classify import OrphanPolicy


def test_never_joined_from_instance_fact_is_returned_after_the_join_deadline():
    world = World().instance("m1", "op-1").listed("m1", launch=NOW - 901, tags=owner_tags("op-1"))
    result = run(world.observe())
    finding = only(result, "m1")
    assert (finding.orphan_class, finding.action, finding.blocked_by) == ("never_joined", "return", ())
    assert finding.evidence["source"] == "instance_fact"
    assert finding.evidence["age"] == 901
    assert finding.evidence["epoch"] == "4.2"
    [action] = result.allowed
    assert (action.kind, action.machine_id, action.epoch) == ("return", "m1", Epoch(4, 2))
    fact = action.fact()
    assert isinstance(fact, ReturnIntent) and fact.machine_ids == ("m1",) and fact.epoch == Epoch(4, 2)
    assert fact.op_id == action.op_id


def test_never_joined_waits_for_the_deadline_and_ignores_joined_machines():
    world = World().instance("young", "op-1").listed("young", launch=NOW - 899)
    world.instance("joined", "op-2").listed("joined").host(instance_ref="op-2-ref0", status=HostStatus.BUSY)
    world.instance("lost-host", "op-3").listed("lost-host").host(machine_id="lost-host", status=HostStatus.LOST)
    assert run(world.observe()).findings == ()


def test_deadline_is_measured_from_the_cloud_launch_time_not_the_fact():
    world = World().instance("m1", "op-1", launch=OLD).listed("m1", launch=YOUNG)
    assert run(world.observe()).findings == ()


def test_crashed_create_with_our_op_tag_maps_to_never_joined_not_tagged_unknown():
    # The intent was committed, the machine created, and the daemon died before the instance fact.
    world = World().intent("op-7").listed("m7", tags=owner_tags("op-7", "op-7-ref0"))
    finding = only(run(world.observe(), OrphanPolicy(orphan_action="terminate")), "m7")
    assert (finding.orphan_class, finding.action) == ("never_joined", "return")
    assert finding.evidence["source"] == "intent_tag"
    assert finding.evidence["op_id"] == "op-7"


def test_joined_machine_of_an_open_intent_is_explained_by_the_intent_not_adopted():
    # The executor is about to commit its instance fact; adopting it would race that fact.
    world = World().intent("op-7").listed("m7", tags=owner_tags("op-7", "op-7-ref0"))
    world.host(instance_ref="op-7-ref0", hostname="w7")
    assert run(world.observe()).findings == ()


def test_crashed_create_that_joined_after_its_intent_closed_is_adopted():
    world = World().intent("op-7").listed("m7", tags=owner_tags("op-7", "op-7-ref0"))
    world.fact(RequestFailed(PROVIDER, EPOCH, "op-7", "outcome unknown"))
    world.host(instance_ref="op-7-ref0", hostname="w7")
    finding = only(run(world.observe()), "m7")
    assert (finding.orphan_class, finding.action) == ("tagged_unknown", "adopt")


def test_tagged_unknown_is_reported_by_default_whatever_its_age():
    world = World().listed("old", launch=OLD).listed("young", launch=YOUNG)
    result = run(world.observe())
    assert [(f.machine_id, f.orphan_class, f.action, f.blocked_by) for f in result.findings] == [
        ("old", "tagged_unknown", "report", ()),
        ("young", "tagged_unknown", "report", ()),
    ]
    facts = [a.fact() for a in result.allowed]
    assert all(isinstance(f, OrphanReported) and f.orphan_class == "tagged_unknown" for f in facts)


def test_tagged_unknown_stop_and_terminate_are_opt_in_after_the_grace():
    world = World().listed("old", launch=NOW - 1800).listed("young", launch=NOW - 1799)
    for action in ("stop", "terminate"):
        result = run(world.observe(), OrphanPolicy(orphan_action=action))
        assert [(f.machine_id, f.action, f.blocked_by) for f in result.findings] == [
            ("old", action, ()),
            ("young", action, ("grace",)),
        ]
        assert [a.machine_id for a in result.allowed] == ["old"]


def test_tagged_machine_whose_fact_says_returned_or_lost_is_tagged_unknown():
    world = World().instance("gone1", "op-1").instance("gone2", "op-2")
    world.fact(ReturnIntent("sim", Epoch(4, 2), "r1", ("gone1",), "idle"))
    world.fact(Returned("sim", Epoch(4, 2), "r1", ("gone1",)))
    world.fact(Lost("sim", Epoch(4, 2), "l1", "gone2", "vanished"))
    world.listed("gone1").listed("gone2")
    result = run(world.observe())
    assert [(f.machine_id, f.orphan_class, f.evidence["fact_state"]) for f in result.findings] == [
        ("gone1", "tagged_unknown", "returned"),
        ("gone2", "tagged_unknown", "lost"),
    ]


def test_already_stopped_machine_needs_nothing_more():
    world = World().listed("m1", status="stopped")
    finding = only(run(world.observe(), OrphanPolicy(orphan_action="stop")), "m1")
    assert (finding.action, finding.blocked_by, finding.allowed) == ("none", (), False)


def test_returning_machine_is_left_to_the_return_path():
    world = World().instance("m1", "op-1").fact(ReturnIntent("sim", Epoch(4, 2), "r1", ("m1",), "idle"))
    assert run(world.observe()).findings == ()  # not listed: no ghost either
    assert run(world.listed("m1").observe()).findings == ()


def test_ghost_is_a_live_fact_the_provider_no_longer_lists():
    world = World().instance("m1", "op-1", hostname="w1")
    first = run(world.observe())
    finding = only(first, "m1")
    assert (finding.orphan_class, finding.action, finding.blocked_by) == ("ghost", "retire", ("ghost_unconfirmed",))
    second = run(world.observe(), memory=first.memory)
    [action] = second.allowed
    assert (action.kind, action.machine_id) == ("retire", "m1")
    lost = action.fact()
    assert isinstance(lost, Lost) and lost.machine_id == "m1" and lost.epoch == Epoch(4, 2)


def test_license_returned_only_when_unused_and_the_provider_agrees():
    world = World().grant("lic-free", 4, 0, True).grant("lic-used", 4, 1, True).grant("lic-disputed", 4, 0, False)
    world.grant("lic-all-used", 4, 4, True)
    result = run(world.observe())
    assert [(f.machine_id, f.orphan_class, f.action, f.blocked_by) for f in result.findings] == [
        ("lic-disputed", "license", "report", ()),
        ("lic-free", "license", "return", ()),
        ("lic-used", "license", "report", ()),
    ]
    assert {a.machine_id: a.kind for a in result.allowed} == {
        "lic-disputed": "report",
        "lic-free": "return",
        "lic-used": "report",
    }
    assert only(result, "lic-used").evidence["in_use"] == 1


def test_a_report_already_recorded_is_not_made_again():
    world = World().listed("m1").grant("lic", 2, 1, False)
    world.fact(OrphanReported("sim", Epoch(4, 2), "o1", "m1", "tagged_unknown", "{}"))
    world.fact(OrphanReported("sim", Epoch(4, 2), "o2", "lic", "license", "{}"))
    result = run(world.observe())
    assert {f.machine_id: f.blocked_by for f in result.findings} == {
        "m1": ("already_reported",),
        "lic": ("already_reported",),
    }
    assert result.allowed == ()


def test_other_providers_machines_and_facts_are_not_ours():
    world = World().instance("m1", "op-1")
    world.listed("m1")  # listed: not a ghost
    world.listed("theirs", tags={**owner_tags(), "provisionerd:provider": "other"})
    world.listed("other-cluster", tags={**owner_tags(), "provisionerd:cluster": "clu-2"})
    world.host(machine_id="m1")
    assert run(world.observe()).findings == ()


def test_an_empty_cluster_id_owns_nothing():
    world = World().listed("m1", tags=owner_tags(**{"provisionerd:cluster": ""}))
    assert run(world.observe(cluster_id="")).findings == ()
