"""The ``agent_restart`` fault (issue 31 item 7, "agent restarts"): joined workers' agents die and come back with
the credential their state file kept; each is admitted again, the lifecycle converges, and the invariant
``agent_rejoin_refused`` catches an agent that comes back without its way in."""

from __future__ import annotations

import json

import pytest

from provisionerd.testing.simulation import World, run_world
from provisionerd.testing.simulation.faults import Fault, FaultPlan
from provisionerd.testing.simulation.lifecycle import Workers
from refcontroller.credentials import new_credential

PLAN = FaultPlan((Fault(90.0, "agent_restart", value=1.0),))


def run(seed: int) -> World:
    world = World(seed, keep_trace=True, plan=PLAN, workload="lifecycle", provider_cap=8)
    run_world(world, wall_budget=60.0)
    return world


def machine(line: str) -> str:
    return str(json.loads(line.split(" ", 3)[3])["machine"])


def notes(world: World, what: str) -> list[str]:
    return [line for line in world.recorder.trace if f" worker {what} " in line]


def test_restarted_agents_rejoin_with_their_kept_credential_and_the_lifecycle_converges() -> None:
    world = run(21)
    restarted = {machine(line) for line in notes(world, "agent_restarted")}
    assert restarted, "no agent was restarted: the seed ran no joined machine at 90 s"
    rejoined = {machine(line) for line in notes(world, "rejoined")}
    # Each came back, unless its machine was returned meanwhile (the demand fell).
    assert rejoined and rejoined <= restarted
    assert all(world.cloud.machines[m]["status"] != "running" for m in restarted - rejoined)
    assert not world.recorder.violations, [v.invariant for v in world.recorder.violations]


def test_an_agent_that_comes_back_without_its_credential_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an agent without ``--state-file`` is: its credential lived in its memory only."""
    restarted = Workers.agents_restarted

    def amnesiac(self: Workers, share: float) -> None:
        for ref in self.credentials:
            self.credentials[ref] = new_credential()
        restarted(self, share)

    monkeypatch.setattr(Workers, "agents_restarted", amnesiac)
    world = run(21)
    assert "agent_rejoin_refused" in {v.invariant for v in world.recorder.violations}
