"""Spot interruption notices in the simulation (issue 34 item 4, put in the simulation as a fault with an
invariant): at ``notice_at`` one joined machine's worker reports that the cloud takes it back ``notice_lead``
seconds later, and the cloud does (``lifecycle.spot_notice``); ``notice_ignored`` when, with no fault near the
notice and a daemon up throughout, the machine was still unreturned when it was taken."""

from __future__ import annotations

import pytest

from provisionerd.planner import drain
from provisionerd.testing.simulation import World, run_world

#: A notice world (``notice_share`` 1) whose notice falls in a calm span, so the invariant judges it.
CALM_NOTICE = 142


def judged(world: World) -> list[str]:
    return [line for line in world.recorder.trace if "notice_judged" in line]


def test_a_noticed_machine_is_returned_before_the_cloud_takes_it() -> None:
    world = World(CALM_NOTICE, keep_trace=True, notice_share=1.0)
    assert world.settings.notice_at > 0 and world.settings.workload == "lifecycle"
    result = run_world(world)
    assert not result.violations
    (line,) = judged(world)
    assert '"returned": true' in line


def test_a_daemon_that_ignores_notices_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariant can fail: with the planner's notice handling taken out, the noticed machine is still running
    when the cloud takes it back."""
    monkeypatch.setattr(drain, "noticed", lambda *args, **kwargs: drain.Noticed())
    world = World(CALM_NOTICE, keep_trace=True, notice_share=1.0)
    result = run_world(world)
    assert "notice_ignored" in {v.invariant for v in result.violations}


def test_notices_are_drawn_after_everything_else() -> None:
    """A seed draws the same world with or without notices but for the notice itself (pinned seeds replay)."""
    for seed in range(40):
        plain, noticed = World(seed, keep_trace=False), World(seed, keep_trace=False, notice_share=1.0)
        assert plain.settings.notice_at == 0
        assert plain.plan == noticed.plan and plain.demand == noticed.demand
        assert (plain.settings.legacy, plain.settings.headroom) == (noticed.settings.legacy, noticed.settings.headroom)
