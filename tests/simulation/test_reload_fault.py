"""The simulation's ``reload`` fault (issue 15, item 7): a config reload while an admin orphan action is under way,
through the daemon's own guarded admin command. Each check can fail on a planted bug: a reload or a command that
raises (``reload_raised``), an admin request answered with no typed refusal (``admin_unanswered``), a restart-needing
reload that changes the running config (``reload_half_applied``), a live reload not in force, or a planner that
keeps the old cap (``reload_not_live``)."""

from __future__ import annotations

import attrs
import pytest

import provisionerd.daemon.orphans as daemon_orphans
import provisionerd.execution.loop as loop_module
from provisionerd.daemon import current_config
from provisionerd.daemon.current_config import ReloadResult
from provisionerd.daemon.root import DaemonCore
from provisionerd.testing.simulation.faults import Fault, FaultPlan
from provisionerd.testing.simulation.runner import run_world
from provisionerd.testing.simulation.world import World

SEED = 35  # a lifecycle world with machines running before 40 s
CAP_SEED = 38  # a lifecycle world whose first demand (4) is above the lowered cap (1)


def reload_world(mode: str, value: float = 0.0, admin: str = "adopt_dry", *, seed: int = SEED, at: float = 40.0):
    plan = FaultPlan((Fault(at, "reload", 40.0, "a", mode=mode, value=value, admin=admin),))
    return World(seed, plan=plan, keep_trace=True, workload="lifecycle", slots=("a",), provider_cap=20)


def answers(world: World) -> list[str]:
    return [line for line in world.recorder.trace if " admin_answer " in line]


@pytest.mark.parametrize(
    ("mode", "value", "admin", "outcome"),
    [
        ("cap_down", 1.0, "adopt_dry", "applied"),
        ("idle_time", 10.0, "adopt", "applied"),
        ("rename", 0.0, "adopt_missing", "restart_needed"),
        ("addresses", 0.0, "return_missing", "restart_needed"),
    ],
)
def test_a_reload_during_an_admin_action_keeps_every_invariant(mode, value, admin, outcome):
    world = reload_world(mode, value, admin)
    result = run_world(world)
    assert result.ok, result.violations
    assert world.reloads.done == world.reloads.under_way == 1 and world.reloads.outcomes == [outcome]
    said = answers(world)
    assert len(said) == 2 and all("refused: machine" in line for line in said)  # decided: not an orphan finding
    if outcome == "applied":
        assert any(" reload_undone " in line for line in world.recorder.trace)


def test_an_admin_request_that_raises_inside_the_guard_is_caught(monkeypatch):
    async def broken(config, request, actor, **_):  # the bug: the admin path reads a provider not running
        raise KeyError("sim-renamed")

    monkeypatch.setattr(daemon_orphans, "decide_and_act", broken)
    result = run_world(reload_world("rename"))
    assert {v.invariant for v in result.violations} == {"admin_unanswered"}


def test_a_reload_that_raises_is_caught(monkeypatch):
    def broken(self, new=None):
        raise KeyError("sim")

    monkeypatch.setattr(DaemonCore, "reload", broken)
    result = run_world(reload_world("rename"))
    assert "reload_raised" in {v.invariant for v in result.violations}


def test_a_restart_needing_reload_that_applies_half_is_caught(monkeypatch):
    real = current_config.plan_reload

    def everything_live(old, new):  # the bug: a restart-needing change is switched to at once
        plan = real(old, new)
        return attrs.evolve(plan, live=(*plan.live, *plan.restart), restart=())

    monkeypatch.setattr(current_config, "plan_reload", everything_live)
    result = run_world(reload_world("addresses"))
    assert "reload_half_applied" in {v.invariant for v in result.violations}


def test_a_live_reload_that_is_not_installed_is_caught(monkeypatch):
    monkeypatch.setattr(current_config.CurrentConfig, "reload", lambda self, new: ReloadResult("applied"))
    result = run_world(reload_world("cap_down", 1.0))
    assert "reload_not_live" in {v.invariant for v in result.violations}


def test_a_planner_that_keeps_the_old_cap_is_caught(monkeypatch):
    world = reload_world("cap_down", 1.0, seed=CAP_SEED, at=1.0)
    result = run_world(world)
    assert result.ok, result.violations
    (window,) = world.reloads.live
    assert window.checked, "no request was planned under the lowered cap: the check would be empty"
    real = loop_module.plan

    def old_cap(state, demand, facts, catalog, hosts, now, policy, rejoin, in_flight):  # the bug: ignores the new cap
        if "sim" in policy.providers:  # the provider's own knobs (the simulation gives it a step limit)
            sim = attrs.evolve(policy.providers["sim"], max_machines=20)
            stale = attrs.evolve(policy, providers={**policy.providers, "sim": sim})
        else:
            stale = attrs.evolve(policy, provider_caps={"sim": 20})
        return real(state, demand, facts, catalog, hosts, now, stale, rejoin, in_flight)

    monkeypatch.setattr(loop_module, "plan", old_cap)
    result = run_world(reload_world("cap_down", 1.0, seed=CAP_SEED, at=1.0))
    assert {v.invariant for v in result.violations} == {"reload_not_live"}
