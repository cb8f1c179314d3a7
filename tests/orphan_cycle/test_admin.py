"""``provisionerd orphans adopt|return``: one finding acted on explicitly, with the command's own lease, through
the gate and the executor; refused (changing nothing) for what is not an orphan finding, for protected machines,
and while someone else (the running daemon) holds the lease."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from cycle_world import NOW, OLD, tags
from rigs.lease_holder import holding_lease
from rigs.memory import memory_config, open_memory_controller

from provisionerd.daemon.orphan_direct import act
from provisionerd.domain.model import NO_EPOCH, InstanceFact, OrphanAdopted, RequestIntent, Returned, ReturnIntent
from provisionerd.orphans.model import orphan_op_id
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

MUTATIONS = ("requestMachines", "requestReturnMachines", "stopMachines")


def world() -> FakeProvider:
    fake = FakeProvider("sim", launch_time=OLD)
    for machine_id, machine_tags in [
        ("i-young", tags("op-young")),  # a tagged unknown inside its grace: policy would only report it
        ("i-nj", tags("op-nj")),
        ("i-untagged", {}),
        ("i-protected", tags("op-p", **{"provisionerd:protect": "1"})),
    ]:
        fake.machines[machine_id] = {
            "machineId": machine_id,
            "name": f"name-{machine_id}",
            "status": "running",
            "template": "small",
            "launchtime": int(NOW - 60) if machine_id == "i-young" else OLD,
            "privateIpAddress": "10.4.0.1",
            "instanceRef": "",
            "tags": machine_tags,
        }
    return fake


def scenario(tmp_path, steps):
    fake = world()
    events = EventLog()
    seen = {}

    async def main():
        async with open_memory_controller(tmp_path, 1) as net:
            config = memory_config(tmp_path, net.addresses)
            async with holding_lease(config, "sim", net.connect, identity="prov-1") as holder:
                await holder.commit(
                    RequestIntent("sim", NO_EPOCH, "op-nj", "small", 1, ("clu/op-nj/0",), ("a" * 64,)),
                    InstanceFact("sim", NO_EPOCH, "op-nj", "clu/op-nj/0", "i-nj", "small", "a" * 64, launch_time=OLD),
                )
            await steps(config, net, fake, events, seen)
            seen["facts"] = [c.fact for c in net.facts()]
            seen["leases"] = net.live_leases()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return fake, events, seen


def do(config, net, fake, events, kind, machine, timeout=30.0):
    return act(
        config,
        kind,
        "sim",
        machine,
        client=PluginClient(fake),
        connect=net.connect,
        timeout=timeout,
        events=events,
        wall_clock=lambda: NOW,
    )


def test_adopt_and_return_one_finding_each_through_the_gate(tmp_path):
    async def steps(config, net, fake, events, seen):
        seen["adopt"] = await do(config, net, fake, events, "adopt", "i-young")
        seen["return"] = await do(config, net, fake, events, "return", "i-nj")

    fake, events, seen = scenario(tmp_path, steps)
    assert seen["adopt"].ok and seen["return"].ok, (seen["adopt"], seen["return"])
    adopted = [f for f in seen["facts"] if isinstance(f, OrphanAdopted)]
    assert [(f.machine_id, f.op_id, f.hostname) for f in adopted] == [
        ("i-young", orphan_op_id("sim", "tagged_unknown", "i-young", "adopt"), "name-i-young")
    ]
    return_op = orphan_op_id("sim", "never_joined", "i-nj", "return")
    (intent,) = [f for f in seen["facts"] if isinstance(f, ReturnIntent)]
    assert intent.op_id == return_op and intent.machine_ids == ("i-nj",) and intent.epoch > adopted[0].epoch
    assert any(isinstance(f, Returned) and f.op_id == return_op for f in seen["facts"])
    assert [(a, d["op_id"]) for a, d in fake.calls if a in MUTATIONS] == [("requestReturnMachines", return_op)]
    audit = list(events.of_kind("orphan_action"))
    assert [(e["action"], e["outcome"], e["confirmed_by"]["by"]) for e in audit] == [
        ("adopt", "ok", "admin"),
        ("return", "ok", "admin"),
    ]
    assert audit[0]["confirmed_by"]["identity"] == "prov-1-orphans-admin"
    assert seen["leases"] == []  # given back


def test_refusals_change_nothing(tmp_path):
    async def steps(config, net, fake, events, seen):
        for machine, kind in [
            ("i-untagged", "return"),
            ("i-protected", "return"),
            ("i-protected", "adopt"),
            ("i-nj", "adopt"),
            ("i-absent", "return"),
        ]:
            seen[(machine, kind)] = await do(config, net, fake, events, kind, machine)
        # While another identity (the running daemon) holds the lease, nothing is done at all.
        async with holding_lease(config, "sim", net.connect, identity="prov-1"):
            seen["held"] = await do(config, net, fake, events, "return", "i-nj", timeout=20.0)

    fake, events, seen = scenario(tmp_path, steps)
    messages = {key: result.message for key, result in seen.items() if isinstance(key, tuple)}
    assert not any(result.ok for key, result in seen.items() if key not in ("facts", "leases"))
    assert "not an orphan finding" in messages[("i-untagged", "return")]
    assert "protected" in messages[("i-protected", "return")] and "protected" in messages[("i-protected", "adopt")]
    assert "only a tagged_unknown" in messages[("i-nj", "adopt")]
    assert "not an orphan finding" in messages[("i-absent", "return")]
    assert "could not get the lease" in seen["held"].message and "held" in seen["held"].message
    assert [a for a, _ in fake.calls if a in MUTATIONS] == []
    assert not any(f.op_id.startswith("orphan-") for f in seen["facts"])
    assert list(events.of_kind("orphan_action")) == []


def test_admin_command_line_errors_exit_2(tmp_path, capsys):
    from test_dry_run import write_config

    from provisionerd.cli import main as cli

    config = tmp_path / "pd.toml"
    write_config(config, "127.0.0.1:9")
    assert cli.main(["orphans", "adopt", "--config", str(config), "--provider", "sim"]) == 2
    assert "--machine" in capsys.readouterr().err
    assert cli.main(["orphans", "return", "--config", str(config), "--provider", "nope", "--machine", "i-1"]) == 2
    assert "no provider named 'nope'" in capsys.readouterr().err


def test_the_direct_path_runs_with_the_daemons_settings_from_the_config(tmp_path):
    """The direct path builds its executor with the daemon's builder, so it polls a return for as long as the
    config's ``provisioning_timeout`` says (the daemon's ``return_timeout``), not the executor's default (1200 s),
    and reads the cloud clock it is given."""
    seen_at: dict = {}

    async def steps(config, net, fake, events, seen):
        provider = attrs.evolve(config.providers[0], provisioning_timeout=50.0)
        config = attrs.evolve(config, providers=(provider,))
        inner = fake.call

        async def call(action, input, *, timeout=None):  # noqa: ASYNC109 - the ProviderClient protocol's signature
            if action == "requestReturnMachines":
                seen_at["called"] = trio.current_time()
            answer = await inner(action, input, timeout=timeout)
            if action == "getRequestStatus":  # the return never finishes
                return {"requests": [{**r, "status": "running", "machines": []} for r in answer["requests"]]}
            return answer

        fake.call = call
        seen["return"] = await do(config, net, fake, events, "return", "i-nj")
        seen_at["answered"] = trio.current_time()

    fake, events, seen = scenario(tmp_path, steps)
    result = seen["return"]
    assert (result.ok, result.outcome, result.answer["code"]) == (False, "failed", "return_timeout"), result
    assert seen_at["answered"] - seen_at["called"] == pytest.approx(50.0)  # was 1200 s, the executor's default
    assert seen["leases"] == []


def test_the_direct_path_decides_on_a_view_resynced_after_its_lease_grant(tmp_path):
    """As the daemon does before it acts on a provider: facts the previous holder committed are never pushed to a
    session without the lease, so the grant asks for a resync and the decision waits for it."""

    async def steps(config, net, fake, events, seen):
        seen["adopt"] = await do(config, net, fake, events, "adopt", "i-young")

    fake, events, seen = scenario(tmp_path, steps)
    assert seen["adopt"].ok, seen["adopt"]
    kinds = [e["event"] for e in events.of_kind("lease_acquired", "refresh", "orphan_action")]
    acquired, acted = kinds.index("lease_acquired"), kinds.index("orphan_action")
    assert "refresh" in kinds[acquired:acted], kinds
