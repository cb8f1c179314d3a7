"""Class ``license`` (d): a grant with more units than anyone uses is reported with its evidence, and returned only
when the controller's in-use count is 0, the licence source agrees and the grant is older than ``orphan_grace``.

The property is the done-when row: whatever the inputs (any counts, unknown ones, any checkout time, any policy,
lease, controller and memory), no licence is ever returned while the controller counts a unit in use, does not
say, or the licence source sees one in use.
"""

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orphan_world import NOW, World, only, run
from test_properties import memories, observations, policies

from provisionerd.domain.model import OrphanReported
from provisionerd.orphans.classify import CountedResource, OrphanPolicy, classify
from provisionerd.orphans.report import render_json, render_table

grants = st.builds(
    CountedResource,
    st.sampled_from(["lic-a", "lic-b", "lic-c"]),
    st.integers(0, 5),
    st.none() | st.integers(0, 5),
    st.booleans(),
    provider_in_use=st.none() | st.integers(0, 5),
    checked_out=st.sampled_from([0.0, NOW - 10, NOW - 1799, NOW - 1800, NOW - 4000, NOW + 60]),
)


@pytest.mark.sweep
@settings(max_examples=300, deadline=None)
@given(observations(), st.lists(grants, max_size=4, unique_by=lambda g: g.resource), policies, memories)
def test_a_licence_is_never_returned_while_in_use_whatever_the_inputs(obs, licenses, policy, memory):
    obs = attrs.evolve(obs, licenses=licenses)
    result = classify(obs, policy, memory)
    by_pool = {g.resource: g for g in licenses}
    for action in result.allowed:
        if action.orphan_class != "license" or action.kind != "return":
            continue
        grant = by_pool[action.machine_id]
        assert grant.in_use == 0, grant  # known, and zero: None is never read as 0
        assert grant.provider_agrees and not grant.provider_in_use, grant
        assert grant.checked_out > 0 and obs.now - grant.checked_out >= policy.orphan_grace, grant
        assert action.units == grant.granted > 0
        assert isinstance(action.fact(), OrphanReported)  # never a ReturnIntent the loop would resume as a machine
    for finding in result.findings:
        if finding.orphan_class != "license":
            continue
        grant = by_pool[finding.machine_id]
        assert grant.granted > grant.used  # a finding is a real mismatch
        assert finding.evidence["granted"] == grant.granted and finding.evidence["in_use"] == grant.in_use
        if grant.in_use != 0 or not grant.provider_agrees or grant.provider_in_use:
            assert finding.action == "report"


def test_unknown_controller_count_is_reported_never_returned():
    world = World().grant("matlab", 3, None, True)
    result = run(world.observe())
    finding = only(result, "matlab")
    assert (finding.action, finding.blocked_by) == ("report", ())
    assert finding.evidence["in_use_source"] == "unknown (the controller does not say)"
    assert finding.evidence["idle"] == 3


def test_the_licence_source_still_counting_use_blocks_the_return():
    world = World()
    world.licenses.append(CountedResource("matlab", 3, 0, False, provider_in_use=1, checked_out=NOW - 4000))
    finding = only(run(world.observe()), "matlab")
    assert finding.action == "report"
    assert (finding.evidence["provider_in_use"], finding.evidence["idle"]) == (1, 3)


def test_grace_and_an_unknown_checkout_time_hold_the_return_back():
    world = World().grant("young", 2, 0, True, checked_out=NOW - 60).grant("unknown", 2, 0, True, checked_out=0.0)
    world.grant("old", 2, 0, True, checked_out=NOW - 1800)
    result = run(world.observe(), OrphanPolicy(orphan_grace=1800))
    assert {f.machine_id: (f.action, f.blocked_by) for f in result.findings} == {
        "old": ("return", ()),
        "unknown": ("return", ("launch_time_unknown",)),
        "young": ("return", ("grace",)),
    }
    [action] = result.allowed
    assert (action.machine_id, action.units) == ("old", 2)


def test_a_later_leak_of_the_same_pool_is_a_new_return():
    first = run(World().grant("matlab", 2, 0, True, checked_out=NOW - 4000).observe()).allowed[0]
    again = run(World().grant("matlab", 2, 0, True, checked_out=NOW - 4000).observe()).allowed[0]
    later = run(World().grant("matlab", 2, 0, True, checked_out=NOW - 2000).observe()).allowed[0]
    assert first.op_id == again.op_id != later.op_id


def test_the_dry_run_report_shows_the_mismatch_with_its_evidence():
    world = World().grant("matlab", 3, 1, True).grant("ansys", 2, None, False)
    result = run(world.observe(), OrphanPolicy(dry_run=True))
    table = render_table(result.findings)
    assert "granted=3 in_use=1 idle=2" in table
    assert "granted=2 in_use=? idle=2" in table
    document = render_json(result.findings)
    assert '"in_use_source": "controller"' in document and '"idle": 2' in document
    assert result.allowed == ()
