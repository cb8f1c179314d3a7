"""Long churn runs (#18 item 7): over virtual hours of churn the controller's resync set and the daemon's view stay
bounded by the live state, and the live state the daemon holds is what a full resync gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from provisionerd.controller import view as view_module
from provisionerd.domain.model import Epoch, InstanceFact, RequestIntent
from provisionerd.planner.fact_view import FactView, fold
from provisionerd.testing.simulation import World, churn, run_world
from provisionerd.testing.simulation.observe import Recorder
from refcontroller.store import FactStore

pytestmark = pytest.mark.process


def churn_world(seed: int, hours: float, **overrides: Any) -> World:
    return World(seed, keep_trace=False, **{**churn.settings_for(hours), **overrides})


@pytest.mark.parametrize("seed", [3, 4])
def test_six_virtual_hours_of_churn_keep_the_resync_set_and_the_view_to_the_live_state(seed: int) -> None:
    world = churn_world(seed, 6.0)
    result = run_world(world, wall_budget=300)
    assert world.churn is not None
    figures = world.churn.summary()
    assert result.ok, result.violations[:3]
    assert figures["samples"] >= 36
    # History grew far past the live state while both stayed within their bounds.
    assert figures["facts_total"] > 5 * figures["max_live_facts"]
    assert figures["max_live_facts"] <= churn.live_bound(world)
    assert figures["max_view_machines"] <= churn.machines_bound(world)


def test_a_view_that_keeps_ended_machines_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The planted bug: the daemon's view folds without pruning, as before #18 (returned machines stay until a
    # full resync).
    monkeypatch.setattr(view_module, "FactView", lambda prune=True, **kw: FactView(prune=False, **kw))
    world = churn_world(3, 4.0, provider_cap=4)
    result = run_world(world, wall_budget=300)
    assert "view_unbounded" in {v.invariant for v in result.violations}


def test_a_view_whose_live_state_differs_from_a_full_resync_is_caught() -> None:
    # The end check on a real store: a daemon that holds the log's live state passes, one that missed a fact (its
    # view lacks the second machine) fails, naming the machine.
    store = FactStore.open(":memory:", incarnation="churn-test")
    try:
        epoch = Epoch(1, 1)
        intent = RequestIntent("sim", epoch, "op-1", "small", 2, ("op-1/1", "op-1/2"), ("h1", "h2"))
        store.append(intent, "prov-a")
        for n in (1, 2):
            fact = InstanceFact("sim", epoch, "op-1", f"op-1/{n}", f"m-{n}", "small", f"h{n}", f"host-{n}", "10.0.0.1")
            store.append(fact, "prov-a")
        world = SimpleNamespace(cluster=SimpleNamespace(store=store), recorder=Recorder(keep_trace=False), instances=[])
        full = fold(store.facts(["sim"], 1, store.last_index(), as_of=store.last_index()), FactView(prune=True))
        short = fold(store.facts(["sim"], 1, 2), FactView(prune=True))
        short.last_index = store.last_index()
        for name, facts in (("whole", full), ("short", short)):
            session = SimpleNamespace(view=SimpleNamespace(facts=facts))
            node = SimpleNamespace(instance=name, core=SimpleNamespace(session=session), scope=trio.CancelScope())
            world.instances.append(node)

        async def check() -> None:
            churn.ChurnWatch().check_views(world, "sim")  # type: ignore[arg-type]

        trio.run(check)
        found = [(v.invariant, v.detail) for v in world.recorder.violations]
        assert found == [
            ("view_diverged", "short: machines: extra [] missing ['m-2']; intents: extra ['op-1'] missing []")
        ]
    finally:
        store.close()
