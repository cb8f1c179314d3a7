"""The admin report: table and JSON, and the end-to-end-shaped scenario from the issue at the pure level."""

import json

from orphan_world import World, owner_tags, run

from provisionerd.domain.model import HostStatus
from provisionerd.orphans.classify import ControllerState, LeaseState, OrphanPolicy
from provisionerd.orphans.report import format_duration, render_json, render_table


def issue_world() -> World:
    """A never-joined machine, a tagged unknown machine, an untagged machine and a ghost fact."""
    world = World()
    world.instance("i-neverjoined", "op-1").listed("i-neverjoined", tags=owner_tags("op-1", "op-1-ref0"))
    world.listed("i-tagged-unknown", name="stray", address="10.0.0.7")
    world.listed("i-untagged", tags={"Name": "someone-elses"})
    world.instance("i-ghost", "op-2").host(machine_id="i-ghost", status=HostStatus.LOST)
    return world


def test_issue_scenario_dry_run_lists_exactly_the_three_orphans():
    # The CLI holds no lease and may talk to a standby: it reports what it sees, blocked by everything that applies.
    obs = issue_world().observe(lease=LeaseState(), controller=ControllerState(primary=True, settled=True))
    result = run(obs, OrphanPolicy(dry_run=True))
    assert [(f.orphan_class, f.machine_id, f.action) for f in result.findings] == [
        ("never_joined", "i-neverjoined", "return"),
        ("tagged_unknown", "i-tagged-unknown", "report"),
        ("ghost", "i-ghost", "retire"),
    ]
    assert result.allowed == ()
    assert all("dry_run" in f.blocked_by and "no_lease" in f.blocked_by for f in result.findings)

    document = json.loads(render_json(result.findings))
    assert set(document) == {"findings", "mutations"} and document["mutations"] == 0
    assert [list(f) for f in document["findings"]] == [
        ["class", "provider", "machine_id", "evidence", "action", "blocked_by"]
    ] * 3
    assert [(f["class"], f["machine_id"], f["action"]) for f in document["findings"]] == [
        ("never_joined", "i-neverjoined", "return"),
        ("tagged_unknown", "i-tagged-unknown", "report"),
        ("ghost", "i-ghost", "retire"),
    ]
    assert document["findings"][2]["blocked_by"] == ["no_lease", "ghost_unconfirmed", "dry_run"]
    assert document["findings"][0]["evidence"]["tags"]["provisionerd:op"] == "op-1"

    table = render_table(result.findings)
    assert "i-untagged" not in table and "i-untagged" not in render_json(result.findings)
    lines = table.splitlines()
    assert lines[0].split() == ["CLASS", "PROVIDER", "MACHINE", "ACTION", "BLOCKED", "BY", "EVIDENCE"]
    assert [line.split()[:4] for line in lines[1:4]] == [
        ["never_joined", "sim", "i-neverjoined", "return"],
        ["tagged_unknown", "sim", "i-tagged-unknown", "report"],
        ["ghost", "sim", "i-ghost", "retire"],
    ]
    assert lines[-1] == "3 finding(s), 0 action(s) allowed, mutations: 0"


def test_the_same_scenario_with_a_lease_acts_on_the_never_joined_and_tagged_machines():
    result = run(issue_world().observe())
    assert [(a.kind, a.machine_id) for a in result.allowed] == [
        ("return", "i-neverjoined"),
        ("report", "i-tagged-unknown"),
    ]


def test_table_escapes_provider_text():
    world = World().listed("evil\nid\x1b[2J", name="a b")
    table = render_table(run(world.observe()).findings)
    assert "\x1b" not in table and len(table.splitlines()) == 3
    assert "evil\\nid\\x1b[2J" in table


def test_empty_report():
    assert render_table([]) == "no orphan findings (mutations: 0)"
    assert json.loads(render_json([])) == {"findings": [], "mutations": 0}


def test_evidence_summary_in_the_table():
    world = World().listed("m1", name="n1").host(hostname="n1").grant("lic", 3, 1, False)
    table = render_table(run(world.observe()).findings)
    assert "host=n1" in table and "granted=3 in_use=1 idle=2 provider_agrees=no" in table


def test_format_duration():
    assert [format_duration(s) for s in (0, 59.9, 61, 3725, -90)] == ["0s", "59s", "1m01s", "1h02m05s", "-1m30s"]


def test_table_says_why_the_breaker_is_open():
    world = World()
    for i in range(5):
        world.listed(f"leak{i}")
    result = run(world.observe(), OrphanPolicy(orphan_action="terminate"))
    table = render_table(result.findings, breaker=result.breaker)
    assert table.splitlines()[-1] == "circuit breaker open: orphan_share (5 of 5 known machines look orphaned)"
    assert "circuit breaker" not in render_table(result.findings)
