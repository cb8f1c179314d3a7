"""A reload is one atomic switch, and an admin request never takes the daemon down (issue 15 item 2, 17 item 6).

The daemon's side in-process on MockClock: the real ``DaemonCore`` against the reference controller over in-memory
streams and an in-memory provider (``test_admin_via_daemon``'s scenario). ``core.reload(new)`` is what
``provisionerd run`` calls on SIGHUP; the real-process SIGHUP is in ``test_admin_via_daemon``.
"""

from __future__ import annotations

import attrs
import trio
import trio.testing
from rigs.memory import memory_config, memory_core, open_memory_controller, running, sim_provider
from test_admin_via_daemon import MATCH_ADOPT, STRAY_RETURN, ask, daemon_scenario

from provisionerd.daemon import orphans as daemon_orphans
from provisionerd.domain.model import DemandItem, OrphanAdopted, RequestIntent, ResourceShape
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider


def renamed(config, name: str = "sim2"):
    """``config`` with its provider renamed (and a live knob changed: nothing of it may apply either)."""
    (provider,) = config.providers
    return attrs.evolve(config, providers=(attrs.evolve(provider, name=name, max_machines=3),))


def test_a_reload_that_renames_the_provider_keeps_the_running_config_and_the_admin_path_answers(tmp_path):
    async def steps(core, fake, seen):
        running, policy = core.config, core.current.policy
        seen["result"] = core.reload(renamed(core.config))
        seen["same_config"] = core.config is running and core.current.policy is policy
        seen["pieces_config"] = core.pieces.config is running
        seen["dry"] = await core.orphan_actions.handle(ask("return", "i-stray", dry_run=True))
        seen["adopt"] = await core.orphan_actions.handle(ask("adopt", "i-match"))
        seen["new_name"] = await core.orphan_actions.handle({**ask("return", "i-stray"), "provider": "sim2"})
        seen["status"] = core.status()

    fake, events, seen = daemon_scenario(tmp_path, steps)
    result = seen["result"]
    assert result.outcome == "restart_needed"
    assert result.applied == ()
    assert "providers (added ['sim2'], removed ['sim'])" in result.restart_needed
    assert seen["same_config"] and seen["pieces_config"]
    dry, adopt = seen["dry"], seen["adopt"]
    assert dry["ok"] and dry["result"]["outcome"] == "would" and dry["result"]["op_id"] == STRAY_RETURN
    assert adopt["ok"] and adopt["result"]["op_id"] == MATCH_ADOPT, adopt
    assert any(isinstance(c.fact, OrphanAdopted) for c in seen["facts"])
    assert seen["new_name"] == {
        "ok": False,
        "refused": "unknown_provider",
        "error": "this daemon has no provider named 'sim2'",
    }
    status = seen["status"]
    assert status["reload"]["last"]["outcome"] == "restart_needed"
    assert status["reload"]["last"]["restart_needed"] == list(result.restart_needed)
    assert status["admin"]["refusals"] == {"unknown_provider": 1}
    (event,) = events.of_kind("config_reloaded")
    assert event["outcome"] == "restart_needed" and event["applied"] == []


def test_an_unexpected_exception_in_an_admin_action_is_a_refusal_and_the_daemon_stays_up(tmp_path, monkeypatch):
    async def boom(*args, **kwargs):
        raise KeyError("sim")  # what a reload once made decide_and_act raise

    async def steps(core, fake, seen):
        monkeypatch.setattr(daemon_orphans, "decide_and_act", boom)
        guarded = core.admin.guard("orphan_action", core.orphan_actions.command)
        seen["reply"] = await guarded.run(ask("return", "i-stray"), None)
        seen["running"] = set(core.orphan_actions.running)
        await trio.sleep(5)  # the daemon's nursery is still up: its loops keep turning
        seen["valid"] = core.keepers["sim"].valid()
        seen["counts"] = core.status()["admin"]["refusals"]

    _fake, _events, seen = daemon_scenario(tmp_path, steps)
    assert seen["reply"]["ok"] is False and seen["reply"]["refused"] == "internal_error"
    assert "KeyError" in seen["reply"]["error"]
    assert seen["running"] == set() and seen["valid"]
    assert seen["counts"] == {"internal_error": 1}


def test_a_command_that_raises_past_the_orphan_actions_is_answered_too(tmp_path):
    async def steps(core, fake, seen):
        async def broken(request, peer_uid):
            raise RuntimeError("a bug")

        def no_bound(request):
            raise ValueError("no bound")

        from provisionerd.daemon.admin_socket import Command

        guarded = core.admin.guard("x", Command(broken, no_bound))
        seen["timeout"] = guarded.timeout({})
        seen["reply"] = await guarded.run({}, None)
        seen["status"] = core.admin.guard_status(lambda: {}["missing"])()

    _fake, _events, seen = daemon_scenario(tmp_path, steps)
    assert seen["timeout"] == 5.0
    assert seen["reply"]["refused"] == "internal_error" and "RuntimeError" in seen["reply"]["error"]
    assert "KeyError" in seen["status"]["error"]


def demand_scenario(tmp_path, steps):
    """The daemon serving ``sim`` (an in-memory provider, ``max_machines = 2``) with a demand of 6 machines."""
    events = EventLog(keep=100_000)
    seen: dict = {}
    base_time = 1_800_000_000
    fake = FakeProvider("sim", {"small": 50}, launch_time=base_time)  # launched "now": far from the join deadline

    async def main():
        async with open_memory_controller(tmp_path, 1) as net:
            config = memory_config(tmp_path, net.addresses, sim_provider(tmp_path, max_machines=2))

            core = memory_core(
                net, config, fake, events=events, offer_interval=5.0, wall=lambda: base_time + trio.current_time()
            )
            async with running(core):
                net.server.cluster.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 6)])
                net.server.broadcast_demand()

                def requested() -> int:
                    return sum(c.fact.count for c in net.facts() if isinstance(c.fact, RequestIntent))

                await steps(core, net, requested, seen)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return fake, events, seen


async def wait_for(predicate, limit: float = 600.0) -> float:
    start = trio.current_time()
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - polls the system under test
            await trio.sleep(0.5)
    return trio.current_time() - start


def test_a_reload_with_a_higher_max_machines_takes_effect_without_a_restart(tmp_path):
    async def steps(core, net, requested, seen):
        await wait_for(lambda: requested() == 2)
        await trio.sleep(120)  # twelve replan intervals: the cap holds
        seen["capped"] = requested()
        (provider,) = core.config.providers
        seen["result"] = core.reload(attrs.evolve(core.config, providers=(attrs.evolve(provider, max_machines=6),)))
        seen["took"] = await wait_for(lambda: requested() == 6)
        await trio.sleep(60)
        seen["after"] = requested()
        seen["policy"] = core.loop.policy.of("sim").max_machines
        seen["status"] = core.status()["reload"]

    fake, events, seen = demand_scenario(tmp_path, steps)
    assert seen["capped"] == 2
    assert seen["result"].outcome == "applied" and seen["result"].applied == ("providers.sim.max_machines",)
    assert seen["took"] < 15.0, seen["took"]  # the next cycle (the reload wakes the loop)
    assert seen["after"] == 6 and seen["policy"] == 6
    assert seen["status"]["last"]["outcome"] == "applied"
    assert len([m for m in fake.machines.values() if m["status"] == "running"]) == 6
    (event,) = events.of_kind("config_reloaded")
    assert event["applied"] == ["providers.sim.max_machines"] and event["restart_needed"] == []


def test_a_reload_with_live_and_restart_changes_applies_the_live_part(tmp_path):
    async def steps(core, net, requested, seen):
        await wait_for(lambda: requested() == 2)
        (provider,) = core.config.providers
        addresses = core.config.controller.addresses
        new = attrs.evolve(
            core.config,
            controller=attrs.evolve(core.config.controller, addresses=("ctl9:7400",)),
            providers=(attrs.evolve(provider, max_machines=6),),
        )
        seen["result"] = core.reload(new)
        seen["took"] = await wait_for(lambda: requested() == 6)
        seen["max"] = core.loop.policy.of("sim").max_machines
        seen["addresses_kept"] = core.config.controller.addresses == addresses

    _fake, events, seen = demand_scenario(tmp_path, steps)
    assert seen["result"].outcome == "applied"
    assert seen["result"].applied == ("providers.sim.max_machines",)
    assert seen["result"].restart_needed == ("controller.addresses",)
    assert seen["max"] == 6 and seen["took"] < 15.0 and seen["addresses_kept"]
    (warning,) = events.of_kind("config_restart_needed")
    assert warning["fields"] == ["controller.addresses"]


def test_a_reload_applies_the_orphan_settings_to_the_running_cycle(tmp_path):
    async def steps(core, fake, seen):
        (provider,) = core.config.providers
        orphans = attrs.evolve(provider.orphans, dry_run=False, grace=7.0, interval=11.0, settle=3.0)
        seen["before"] = core.orphan_cycles["sim"].policy.dry_run
        seen["result"] = core.reload(attrs.evolve(core.config, providers=(attrs.evolve(provider, orphans=orphans),)))
        cycle = core.orphan_cycles["sim"]
        seen["after"] = (cycle.policy.dry_run, cycle.policy.orphan_grace, cycle.interval)
        seen["settle"] = core.pieces.settle_trackers["sim"].settle
        passes = cycle.passes
        await trio.sleep(100)
        seen["passes"] = cycle.passes - passes

    _fake, _events, seen = daemon_scenario(tmp_path, steps)
    assert seen["before"] is True
    assert seen["result"].outcome == "applied"
    assert set(seen["result"].applied) == {
        "providers.sim.orphans.dry_run",
        "providers.sim.orphans.grace",
        "providers.sim.orphans.interval",
        "providers.sim.orphans.settle",
    }
    assert seen["after"] == (False, 7.0, 11.0) and seen["settle"] == 3.0
    # After the sleep under way (the old 60 s), every 11 s: at least 4 passes in 100 s (the old interval: at most 2).
    assert seen["passes"] >= 4, seen["passes"]
