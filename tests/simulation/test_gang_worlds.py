"""All-or-nothing demand in the simulation (issue 35 item 5, put in the simulation as a fault with an invariant): in a
gang world the lifecycle item asks for all its machines or none, and the cloud breaks the promise on a share of
those requests before the faults' horizon (it launches one machine fewer and says ``complete_with_error``).
``partial_gang_kept`` when what such a request made still runs at the end; convergence then holds as usual."""

from __future__ import annotations

import pytest

from provisionerd.planner import gang
from provisionerd.testing.simulation import World, run_seed, run_world
from provisionerd.testing.simulation.faults import (
    FLEET_CHANCE,
    GANG_CHANCE,
    LEGACY_CHANCE,
    NOTICE_CHANCE,
    PRIORITY_CHANCE,
)

#: The shares ``provisionerd simulate`` draws its worlds with (its defaults), to replay a seed the campaign found.
CAMPAIGN_SHARES = {
    "legacy_share": LEGACY_CHANCE,
    "fleet_share": FLEET_CHANCE,
    "notice_share": NOTICE_CHANCE,
    "gang_share": GANG_CHANCE,
    "priority_share": PRIORITY_CHANCE,
}

#: A gang world (``gang_share`` 1) whose cloud answers an all-or-nothing request in part, among the world's faults.
BROKEN_PROMISE = 1


def partial_ops(world: World) -> list[str]:
    made = world.recorder.creations
    return [
        op
        for op, count in world.cloud.whole_asked.items()
        if 0 < sum(len(c.machine_ids) for c in made.get(op, ())) < count
    ]


def test_a_request_answered_in_part_is_returned_whole_and_the_world_converges() -> None:
    world = World(BROKEN_PROMISE, keep_trace=False, workload="lifecycle", gang_share=1.0)
    assert world.settings.all_or_nothing and world.settings.gang_partial > 0
    result = run_world(world)
    assert partial_ops(world), "the cloud answered an all-or-nothing request in part"
    assert not result.violations, result.violations


def test_a_daemon_that_keeps_a_partial_answer_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariant can fail: with the planner's return of a broken op taken out, its machines run at the end."""
    monkeypatch.setattr(gang, "broken_members", lambda *args: iter(()))
    world = World(BROKEN_PROMISE, keep_trace=False, workload="lifecycle", gang_share=1.0)
    result = run_world(world)
    assert "partial_gang_kept" in {v.invariant for v in result.violations}


def test_gang_worlds_are_drawn_after_everything_else() -> None:
    """A seed draws the same world with or without all-or-nothing demand but for that (pinned seeds replay)."""
    for seed in range(40):
        plain, whole = World(seed, keep_trace=False), World(seed, keep_trace=False, gang_share=1.0)
        assert not plain.settings.all_or_nothing
        assert plain.plan == whole.plan and plain.demand == whole.demand
        assert (plain.settings.legacy, plain.settings.headroom, plain.settings.notice_at) == (
            whole.settings.legacy,
            whole.settings.headroom,
            whole.settings.notice_at,
        )


def test_seed_936331540_a_gang_world_settles_after_its_longest_capacity_backoff() -> None:
    """Found by the campaign from random start 936331536: the cloud answered the 4th all-or-nothing request in a row
    in part at 198.9 s, just before the horizon, so the offer backed off 8x ``capacity_backoff`` (160 s, the
    planner's cap). Asked again at 360.6 s, the headroom machine waited a step window and was asked at 391 s, 9 s
    before the check at 400 s. Not the daemon's: gang worlds now settle 100 s longer, as legacy worlds do."""
    world = World(936331540, keep_trace=False, **CAMPAIGN_SHARES)
    assert world.settings.all_or_nothing and world.settings.gang_partial > 0 and world.settings.headroom
    assert not run_world(world).violations


@pytest.mark.xfail(
    strict=True,
    reason="late machines of an op a restart's recovery failed are reported as tagged_unknown and kept",
)
def test_seed_975137348_the_late_machines_of_a_failed_partial_op_are_returned():
    """Found by a 10,000-seed campaign from 975133181 (replayed with the campaign's shares): a restart's recovery
    failed an all-or-nothing op it listed empty, the cloud then made 4 of its 5 machines, and the orphan cycle,
    which no longer knew the op (a failed op with no live machine leaves the pruned view at once), reported them as
    ``tagged_unknown``: kept (docs/simulation.md)."""
    result = run_seed(975137348, **CAMPAIGN_SHARES)
    assert "partial_gang_kept" not in {v.invariant for v in result.violations}
