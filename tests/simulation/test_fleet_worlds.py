"""Fleet-policy worlds (issue 35: "the campaign's workloads use priorities, limits, warm headroom"): with the
chance ``fleet_share`` a lifecycle world keeps warm headroom on its provider and, in half of them, a CPU limit one
machine below its cap; the convergence check then wants the demand plus the headroom, within the caps and the
limit, all joined."""

from __future__ import annotations

from provisionerd.testing.simulation import World, run_world
from provisionerd.testing.simulation.faults import FLEET_CHANCE


def fleet_world(seed: int) -> World:
    world = World(seed, keep_trace=True, fleet_share=FLEET_CHANCE)
    assert world.settings.headroom, f"seed {seed} no longer draws a fleet policy"
    return world


def test_headroom_above_the_demand_and_a_cpu_limit_below_the_cap_converge() -> None:
    # Seed 27: headroom 1, CPU limit 14 (7 machines of 2 CPUs) under a cap of 8, a final demand of 3.
    world = fleet_world(27)
    assert (world.settings.headroom, world.settings.cpu_limit, world.settings.provider_cap) == (1, 14, 8)
    result = run_world(world)
    assert not result.violations
    running = [m for m in world.cloud.running() if m["instanceRef"] in world.workers.joined]
    assert len(running) == world.demand[-1].count + 1
    warm = [c for c in world.recorder.commits if c.kind == "RequestIntent" and c.fact.demand_id == "headroom:sim/small"]
    assert warm, "the headroom asked for machines of its own"


def test_the_limit_binds_when_demand_passes_it() -> None:
    # Seed 5: headroom 2, CPU limit 6 (3 machines) under a cap of 4, a final demand of 7: 3 machines, no more.
    world = fleet_world(5)
    assert (world.settings.cpu_limit, world.demand[-1].count) == (6, 7)
    result = run_world(world)
    assert not result.violations
    assert len(world.cloud.running()) == 3
