"""Provider priorities in the simulation (issue 35 item 3, in the campaign's workloads): in a priority world the cloud
offers ``small`` (priority 0, room for 2-5 machines) and ``spare`` (priority 1), so demand beyond ``small`` goes to
``spare``; every fault applies, and convergence and the other invariants judge the run."""

from __future__ import annotations

import pytest

from provisionerd.planner import capacity
from provisionerd.testing.simulation import World, run_world

#: A priority world with a store loss: the lost log's 3 machines fill ``small`` (the admin's now), so ``small``
#: refuses every request for capacity and the demand must go to ``spare``.
SMALL_FULL = 7


def on_spare(world: World) -> int:
    return sum(1 for m in world.cloud.machines.values() if m["template"] == "spare" and m["status"] == "running")


def test_demand_a_full_first_priority_cannot_hold_goes_to_the_second_and_the_world_converges() -> None:
    world = World(SMALL_FULL, keep_trace=False, workload="lifecycle", priority_share=1.0)
    assert world.settings.priority_split > 0 and "store_loss" in world.plan.kinds()
    result = run_world(world)
    assert not result.violations, result.violations
    assert on_spare(world) > 0


def test_without_the_doubling_backoff_the_refused_first_priority_starves_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the campaign found: a refused ``small`` was asked again each time the provider's step window freed room
    (its 20 s back-off shorter than the 30 s window that its own refused request filled), so ``spare`` was never
    asked and the world never converged. Refusals in a row now double the back-off (``CAPACITY_DOUBLINGS``)."""
    monkeypatch.setattr(capacity, "CAPACITY_DOUBLINGS", 0)
    world = World(SMALL_FULL, keep_trace=False, workload="lifecycle", priority_share=1.0)
    result = run_world(world)
    assert "no_convergence" in {v.invariant for v in result.violations}


def test_priority_worlds_are_drawn_after_everything_else() -> None:
    """A seed draws the same world with or without priorities but for that (pinned seeds replay)."""
    for seed in range(40):
        plain, split = World(seed, keep_trace=False), World(seed, keep_trace=False, priority_share=1.0)
        assert not plain.settings.priority_split
        assert plain.plan == split.plan and plain.demand == split.demand
        assert (plain.settings.legacy, plain.settings.headroom, plain.settings.all_or_nothing) == (
            split.settings.legacy,
            split.settings.headroom,
            split.settings.all_or_nothing,
        )
