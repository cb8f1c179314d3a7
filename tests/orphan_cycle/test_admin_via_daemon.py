"""``provisionerd orphans adopt|return`` while the daemon runs: the daemon's admin socket answers
``orphan_action`` and acts with its own view, lease, gate and executor; the CLI asks it first and acts directly
only when no daemon listens.

The daemon's side runs in-process on MockClock (the real ``DaemonCore`` against the reference controller over
in-memory streams and an in-memory provider); the socket layer and the CLI's choice of path on the real clock
with small stand-in commands; the whole thing with real processes (the reference controller, ``provisionerd run``,
the simulated provider's plugin processes and the CLI), marked ``process``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import sim_state
import trio
import trio.testing
from cycle_world import OLD, World, tags
from real_world import SECRET, real_world, sim
from rigs.memory import memory_config, memory_core, open_memory_controller, running

from provisionerd.cli import main as cli
from provisionerd.config.loader import Config
from provisionerd.daemon import admin_socket
from provisionerd.daemon.admin_socket import Command, query, request, serve_admin_socket
from provisionerd.daemon.orphan_admin import AdminRequest, AdminResult
from provisionerd.daemon.orphan_direct import via_daemon
from provisionerd.domain.model import HostState, HostStatus, OrphanAdopted, Returned, ReturnIntent
from provisionerd.orphans.model import orphan_op_id
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

NOW = OLD + 4000.0
MUTATIONS = ("requestMachines", "requestReturnMachines", "stopMachines")
STRAY_RETURN = orphan_op_id("sim", "tagged_unknown", "i-stray", "return")
MATCH_ADOPT = orphan_op_id("sim", "tagged_unknown", "i-match", "adopt")


def world() -> FakeProvider:
    return (
        World()
        .machine("i-stray", tags("op-stray"))  # tagged, no fact, no host: policy would only report it
        .machine("i-match", tags("op-match"))  # tagged, no fact, one live host runs on it: adoptable
        .machine("i-protected", tags("op-p", **{"provisionerd:protect": "1"}))
        .machine("i-untagged", {})
        .provider
    )


def ask(kind: str, machine: str, **extra) -> dict:
    return {"cmd": "orphan_action", "action": kind, "provider": "sim", "machine": machine, "user": "alice", **extra}


def daemon_scenario(tmp_path, steps, fake: FakeProvider | None = None):
    """The daemon (its own orphan cycle in dry run, so only the admin acts) holding the lease for ``sim``; a live
    host ``node-match`` on ``i-match``; ``steps(core, fake, seen)`` runs once the daemon's view is synced."""
    fake = fake if fake is not None else world()
    events = EventLog(keep=100_000)
    seen: dict = {}

    async def main():
        async with open_memory_controller(tmp_path, 1) as net:
            net.server.cluster.hosts.add(
                HostState("clu/op-match/0", "sim", "i-match", HostStatus.IDLE, NOW, "node-match", "10.1.0.2")
            )
            config = memory_config(tmp_path, net.addresses, orphans={"dry_run": True})
            core = memory_core(net, config, fake, events=events, wall=lambda: NOW + trio.current_time())
            async with running(core):
                with trio.fail_after(120):
                    while not (core.keepers["sim"].valid() and core.session.synced_for("sim")):  # noqa: ASYNC110 - no event for both
                        await trio.sleep(0.5)
                seen["epoch"] = core.keepers["sim"].current()
                seen["net"] = net
                await steps(core, fake, seen)
                seen["epoch_after"] = core.keepers["sim"].current()
            seen["facts"] = net.facts()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return fake, events, seen


def recording_returns(fake: FakeProvider, seen: dict, gate: trio.Event | None = None) -> None:
    """Note the controller's log at each ``requestReturnMachines`` (and hold the call until ``gate`` is set)."""
    inner = fake.call

    async def call(action, input, *, timeout=None):
        if action == "requestReturnMachines":
            seen.setdefault("log_at_call", []).append([c.fact for c in seen["net"].facts()])
            seen.setdefault("called", trio.Event()).set()
            if gate is not None:
                await gate.wait()
        return await inner(action, input, timeout=timeout)

    fake.call = call


def test_return_and_adopt_go_through_the_running_daemon(tmp_path):
    async def steps(core, fake, seen):
        recording_returns(fake, seen)
        seen["return"] = await core.orphan_actions.handle(ask("return", "i-stray"), 4242)
        seen["adopt"] = await core.orphan_actions.handle(ask("adopt", "i-match", user="bob"))

    fake, events, seen = daemon_scenario(tmp_path, steps)
    returned, adopted = seen["return"], seen["adopt"]
    assert returned["ok"] and adopted["ok"], (returned, adopted)
    assert returned["result"]["op_id"] == STRAY_RETURN and returned["result"]["via"] == "daemon"
    assert returned["result"]["outcome"] == "ok" and returned["result"]["orphan_class"] == "tagged_unknown"
    epoch = seen["epoch"]
    facts = seen["facts"]
    (intent,) = [c for c in facts if isinstance(c.fact, ReturnIntent) and c.fact.op_id == STRAY_RETURN]
    (done,) = [c for c in facts if isinstance(c.fact, Returned) and c.fact.op_id == STRAY_RETURN]
    assert intent.fact.machine_ids == ("i-stray",) and intent.fact.epoch == epoch and done.fact.epoch == epoch
    assert intent.fact.reason == "admin: orphan tagged_unknown: return"
    assert intent.index < done.index
    # The intent was in the controller's log when the provider was called, under the daemon's epoch.
    (log_at_call,) = seen["log_at_call"]
    assert intent.fact in log_at_call
    assert [(a, d["op_id"]) for a, d in fake.calls if a in MUTATIONS] == [("requestReturnMachines", STRAY_RETURN)]
    assert fake.machines["i-stray"]["status"] != "running"
    (adoption,) = [c.fact for c in facts if isinstance(c.fact, OrphanAdopted)]
    assert (adoption.machine_id, adoption.op_id, adoption.hostname, adoption.instance_ref, adoption.epoch) == (
        "i-match",
        MATCH_ADOPT,
        "node-match",
        "clu/op-match/0",
        epoch,
    )
    # The daemon kept its lease throughout: nobody else took it, no new epoch.
    assert seen["epoch_after"] == epoch
    audit = list(events.of_kind("orphan_action"))
    assert [(e["action"], e["machine_id"], e["outcome"], e["op_id"]) for e in audit] == [
        ("return", "i-stray", "ok", STRAY_RETURN),
        ("adopt", "i-match", "ok", MATCH_ADOPT),
    ]
    first = audit[0]["confirmed_by"]
    assert {k: first[k] for k in ("by", "user", "identity", "via", "uid")} == {
        "by": "admin",
        "user": "alice",
        "identity": "prov-1",
        "via": "daemon",
        "uid": 4242,
    }
    assert "dry_run" in first["overridden"]  # the daemon's own policy would not have acted: the admin's word did
    assert audit[1]["confirmed_by"]["user"] == "bob" and "uid" not in audit[1]["confirmed_by"]
    assert all(e["epoch"] == epoch for e in audit)


def test_refusals_and_bad_requests_change_nothing(tmp_path):
    asks = {
        "protected-return": ask("return", "i-protected"),
        "protected-adopt": ask("adopt", "i-protected"),
        "untagged": ask("return", "i-untagged"),
        "absent": ask("return", "i-absent"),
        "host-runs-on-it": ask("return", "i-match"),
        "dry-run": ask("return", "i-stray", dry_run=True),
        "bad-action": ask("reboot", "i-stray"),
        "no-machine": {"cmd": "orphan_action", "action": "return", "provider": "sim"},
        "bad-dry-run": ask("return", "i-stray", dry_run="yes"),
        "long-id": ask("return", "i" * 300),
        "other-provider": {**ask("return", "i-stray"), "provider": "aws"},
    }

    async def steps(core, fake, seen):
        for name, document in asks.items():
            seen[name] = await core.orphan_actions.handle(document, None)

    fake, events, seen = daemon_scenario(tmp_path, steps)
    results = {name: seen[name].get("result") for name in asks}
    errors = {name: seen[name].get("error", "") for name in asks}
    assert all(seen[name]["ok"] is False for name in asks if name != "dry-run")
    assert "protected" in results["protected-return"]["message"]
    assert "protected" in results["protected-adopt"]["message"]
    assert "not an orphan finding" in results["untagged"]["message"]
    assert "not an orphan finding" in results["absent"]["message"]
    assert "matches a live host" in results["host-runs-on-it"]["message"]
    dry = results["dry-run"]
    assert seen["dry-run"]["ok"] and dry["outcome"] == "would" and dry["op_id"] == STRAY_RETURN
    assert "nothing changed" in dry["message"]
    assert "'action' must be one of adopt, return" in errors["bad-action"]
    assert "'machine' must be a non-empty string" in errors["no-machine"]
    assert "'dry_run' must be true or false" in errors["bad-dry-run"]
    assert "at most 256 characters" in errors["long-id"]
    assert "no provider named 'aws'" in errors["other-provider"]
    assert [a for a, _ in fake.calls if a in MUTATIONS] == []
    assert not any(c.fact.op_id.startswith("orphan-") for c in seen["facts"])
    assert list(events.of_kind("orphan_action")) == []


def test_one_action_per_machine_and_it_outlives_a_request_that_gave_up(tmp_path):
    gate = trio.Event()

    async def steps(core, fake, seen):
        recording_returns(fake, seen, gate)
        seen["called"] = trio.Event()

        async def first():
            with trio.move_on_after(30) as scope:  # as the socket does when its bound passes
                seen["first"] = await core.orphan_actions.handle(ask("return", "i-stray"))
            seen["first_gave_up"] = scope.cancelled_caught

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await seen["called"].wait()  # the provider call is under way (and held)
            seen["second"] = await core.orphan_actions.handle(ask("return", "i-stray"))
            seen["other"] = await core.orphan_actions.handle(ask("return", "i-protected"))
        # The request gave up; the action did not: still running, still exclusive.
        seen["running_after_give_up"] = set(core.orphan_actions.running)
        seen["third"] = await core.orphan_actions.handle(ask("adopt", "i-stray"))
        gate.set()
        with trio.fail_after(60):
            while core.orphan_actions.running:  # noqa: ASYNC110 - the actions expose no event for "all finished"
                await trio.sleep(0.5)
        seen["log"] = [c.fact for c in seen["net"].facts()]

    fake, events, seen = daemon_scenario(tmp_path, steps)
    assert seen["first_gave_up"] and "first" not in seen
    for name in ("second", "third"):
        assert seen[name]["busy"] is True and "under way" in seen[name]["error"], seen[name]
    assert "protected" in seen["other"]["result"]["message"]  # another machine is not held up by the busy one
    assert seen["running_after_give_up"] == {("sim", "i-stray")}
    assert any(isinstance(f, Returned) and f.op_id == STRAY_RETURN for f in seen["log"])
    (audit,) = events.of_kind("orphan_action")
    assert (audit["op_id"], audit["outcome"]) == (STRAY_RETURN, "ok")
    assert [a for a, _ in fake.calls if a in MUTATIONS] == ["requestReturnMachines"]


def test_the_direct_dry_run_takes_no_lease_and_changes_nothing(tmp_path):
    """No daemon: ``--dry-run`` on the direct path reads through a read-only client and joins without a lease."""
    from provisionerd.daemon.orphan_direct import act

    fake = world()
    events = EventLog()
    seen: dict = {}

    async def main():
        async with open_memory_controller(tmp_path, 1) as net:
            config = memory_config(tmp_path, net.addresses)
            for machine in ("i-stray", "i-protected"):
                seen[machine] = await act(
                    config,
                    "return",
                    "sim",
                    machine,
                    client=PluginClient(fake),
                    connect=net.connect,
                    events=events,
                    wall_clock=lambda: NOW,
                    user="carol",
                    dry_run=True,
                )
            seen["facts"] = net.facts()
            seen["leases"] = net.live_leases()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    stray, protected = seen["i-stray"], seen["i-protected"]
    assert (stray.ok, stray.outcome, stray.op_id, stray.via) == (True, "would", STRAY_RETURN, "direct")
    assert "the lease would be taken first" in stray.message and "nothing changed" in stray.message
    assert not protected.ok and "blocked by protected" in protected.message
    assert [a for a, _ in fake.calls] == ["listMachines", "listMachines"]
    assert seen["facts"] == [] and seen["leases"] == []
    assert list(events.of_kind("lease_acquired", "orphan_action")) == []


# --- the socket layer and the CLI's choice of path (real clock, small stand-in commands) ------------------------


def test_the_socket_bounds_requests_and_hands_commands_the_peer(monkeypatch, sock_dir):
    sock = sock_dir / "admin.sock"
    monkeypatch.setattr(admin_socket, "CLIENT_TIMEOUT", 0.5)
    seen: dict = {}

    async def echo(document, uid):
        return {"ok": True, "uid": uid, "got": document}

    async def slow(document, uid):
        await trio.sleep(60)
        return {"ok": True}

    commands = {"echo": Command(echo, lambda r: 5.0), "slow": Command(slow, lambda r: 0.3)}

    def raw(payload: bytes) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(sock))
            client.sendall(payload)
            return json.loads(client.makefile("rb").readline())

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, sock, lambda: {"up": True}, commands)
            seen["mode"] = sock.stat().st_mode & 0o777
            run = trio.to_thread.run_sync
            seen["status"] = await run(query, sock)
            seen["echo"] = await run(request, sock, {"cmd": "echo", "x": 1})
            started = time.monotonic()
            seen["slow"] = await run(request, sock, {"cmd": "slow"}, 10.0)
            seen["slow_took"] = time.monotonic() - started
            seen["large"] = await run(raw, b"{" + b" " * 5000 + b"}\n")
            seen["deep"] = await run(raw, b"[" * 4000 + b"\n")
            seen["unknown"] = await run(query, sock, "reboot")
            seen["silent"] = await run(raw, b"")  # sends nothing, keeps the connection open
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen["mode"] == 0o600
    assert seen["status"] == {"ok": True, "status": {"up": True}}
    assert seen["echo"] == {"ok": True, "uid": os.getuid(), "got": {"cmd": "echo", "x": 1}}
    assert seen["slow"]["pending"] is True and "events log" in seen["slow"]["error"]
    assert seen["slow_took"] < 5.0
    assert "too large" in seen["large"]["error"]
    assert seen["deep"] == {"ok": False, "refused": "not_json", "error": "request is not JSON"}
    assert "known: 'status', 'echo', 'slow'" in seen["unknown"]["error"]
    assert "no request line" in seen["silent"]["error"]
    assert not sock.exists()


def write_config(path: Path, sock: Path) -> Config:
    """test_dry_run's config (provider ``sim``, a controller nobody listens on) with its admin socket ``sock``."""
    from test_dry_run import write_config as write_base

    assert sock.name == "admin.sock"
    return write_base(path, "127.0.0.1:9", state=sock.parent)


def test_the_cli_asks_the_daemon_and_acts_directly_only_when_none_listens(tmp_path, capsys, sock_dir):
    sock = sock_dir / "admin.sock"
    config = write_config(tmp_path / "pd.toml", sock)
    req = AdminRequest("return", "sim", "i-stray", "alice")
    # No socket file, then a stale socket file (nobody listening): no daemon, so the direct path may act.
    assert via_daemon(config, req) is None
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    assert via_daemon(config, req) is None
    sock.unlink()
    asked: list = []
    answers = {
        "i-stray": {
            "ok": True,
            "result": AdminResult(
                True,
                "return i-stray: ok (by prov-1)",
                {"returned": ["i-stray"]},
                STRAY_RETURN,
                "tagged_unknown",
                "ok",
                "daemon",
            ).to_json(),
        },
        "i-protected": {
            "ok": False,
            "result": AdminResult(False, "return i-protected: refused: blocked by protected", via="daemon").to_json(),
        },
        "i-busy": {"ok": False, "busy": True, "error": "busy: an action on machine 'i-busy' is under way"},
        "i-garbled": {"ok": True, "result": ["not", "a", "result"]},
    }

    async def orphan_action(document, uid):
        asked.append(document)
        return answers[document["machine"]]

    codes = {}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, sock, dict, {"orphan_action": Command(orphan_action, lambda r: 5)})
            config_path = str(tmp_path / "pd.toml")
            for machine, extra in [
                ("i-stray", ["--json"]),
                ("i-protected", []),
                ("i-busy", []),
                ("i-garbled", []),
                ("i-stray", ["--dry-run"]),
            ]:
                argv = ["orphans", "return", "--config", config_path, "--provider", "sim", "--machine", machine, *extra]
                codes[(machine, tuple(extra))] = await trio.to_thread.run_sync(cli.main, argv)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert codes == {
        ("i-stray", ("--json",)): 0,
        ("i-protected", ()): 1,
        ("i-busy", ()): 1,
        ("i-garbled", ()): 1,
        ("i-stray", ("--dry-run",)): 0,
    }
    out, err = capsys.readouterr()
    printed = json.loads(out.splitlines()[0])
    assert printed["ok"] is True and printed["op_id"] == STRAY_RETURN and printed["via"] == "daemon"
    assert "refused: blocked by protected" in err and "busy: an action on machine 'i-busy'" in err
    assert "malformed" in err
    user = asked[0]["user"]
    assert asked[0] == {
        "cmd": "orphan_action",
        "action": "return",
        "provider": "sim",
        "machine": "i-stray",
        "user": user,
        "dry_run": False,
    }
    assert asked[-1]["dry_run"] is True
    # TLS files were never loaded: the direct path was not taken while a daemon answered.


@pytest.mark.parametrize(
    "reply, expected",
    [
        (b"not json\n", "cannot use the daemon's admin socket"),
        (b"[1, 2]\n", "cannot use the daemon's admin socket"),
    ],
)
def test_a_daemon_that_answers_nonsense_is_not_bypassed(tmp_path, reply, expected, sock_dir):
    sock = sock_dir / "admin.sock"
    config = write_config(tmp_path / "pd.toml", sock)
    result: list = []

    async def main():
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(str(sock))
        listener.listen(1)

        async def serve():
            conn, _ = await listener.accept()
            with conn:
                await conn.recv(4096)
                await conn.send(reply)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            result.append(await trio.to_thread.run_sync(via_daemon, config, AdminRequest("return", "sim", "i-1")))
        listener.close()

    trio.run(main)
    (answer,) = result
    assert answer is not None and answer.ok is False and expected in answer.message


# --- the whole thing with real processes ----------------------------------------------------------------------


def plant_orphans(data: Path, *machines: tuple[str, dict]) -> None:
    """Machines the simulated provider holds that nobody asked this daemon for, launched a minute ago: inside the
    orphan grace, which the admin's word overrides."""
    launched = int(time.time()) - 60
    for n, (machine_id, machine_tags) in enumerate(machines):
        sim_state.plant_machine(data, machine_id, machine_tags, launched, n=n + 1)


def match_host(ctl) -> None:
    """The live host ``node-match`` runs on ``i-match``: adoptable, never returnable."""
    ctl.server.cluster.hosts.add(
        HostState("clu/op-match/0", "sim", "i-match", HostStatus.IDLE, time.time(), "node-match", "10.9.0.2")
    )


@pytest.mark.process
def test_orphans_adopt_and_return_through_a_real_daemon_then_directly_once_it_stopped(tmp_path, sock_dir):
    seen: dict = {}

    async def main():
        async with real_world(tmp_path, sock_dir, sim(tmp_path, dry_run=True)) as world:
            plant_orphans(
                world.data,
                ("i-stray", tags("op-stray")),
                ("i-match", tags("op-match")),
                ("i-direct", tags("op-direct")),
                ("i-protected", tags("op-p", **{"provisionerd:protect": "1"})),
                ("i-untagged", {}),
            )
            match_host(world.ctl)
            daemon = world.daemon
            proc = await daemon.start()
            held = await daemon.wait_held(60)
            seen["daemon_epoch"] = held["leases"][0]["epoch"]
            seen["return"] = await world.orphans("return", "--provider", "sim", "--machine", "i-stray", "--json")
            seen["adopt"] = await world.orphans("adopt", "--provider", "sim", "--machine", "i-match")
            seen["protected"] = await world.orphans("return", "--provider", "sim", "--machine", "i-protected")
            seen["dry"] = await world.orphans(
                "return", "--provider", "sim", "--machine", "i-direct", "--dry-run", "--json"
            )
            seen["state_mid"] = sim_state.read(world.data)
            seen["still_held"] = await daemon.wait_status("the daemon answering", lambda s: True)
            seen["rc"] = await proc.stop(20)
            seen["log"] = proc.log.read_text()
            # No daemon now (its socket file is gone): the command acts directly, with its own lease.
            seen["direct"] = await world.orphans("return", "--provider", "sim", "--machine", "i-direct", "--json")
            seen["facts"] = world.facts()
            seen["leases"] = world.ctl.server.cluster.leases.live_leases(trio.current_time())
            seen["state_after"] = sim_state.read(world.data)
            seen["events"] = daemon.events()
            seen["events_text"] = daemon.events_path.read_text()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"][-3000:]
    outputs = {name: seen[name] for name in ("return", "adopt", "protected", "dry", "direct")}
    codes = {name: result.returncode for name, result in outputs.items()}
    assert codes == {"return": 0, "adopt": 0, "protected": 1, "dry": 0, "direct": 0}, {
        name: result.stderr[-2000:] for name, result in outputs.items()
    }
    returned = json.loads(seen["return"].stdout)
    assert (returned["ok"], returned["via"], returned["op_id"], returned["outcome"]) == (
        True,
        "daemon",
        STRAY_RETURN,
        "ok",
    )
    assert "adopt i-match: ok (by prov-main)" in seen["adopt"].stdout
    assert "blocked by protected" in seen["protected"].stderr
    dry = json.loads(seen["dry"].stdout)
    assert (dry["ok"], dry["via"], dry["outcome"]) == (True, "daemon", "would")
    direct = json.loads(seen["direct"].stdout)
    direct_op = orphan_op_id("sim", "tagged_unknown", "i-direct", "return")
    assert (direct["ok"], direct["via"], direct["op_id"]) == (True, "direct", direct_op)
    # The controller's log: each return's intent before its result; the daemon's under the daemon's epoch.
    facts = seen["facts"]
    by_op = {}
    for committed in facts:
        by_op.setdefault(committed.fact.op_id, []).append(committed)
    assert [type(c.fact).__name__ for c in by_op[STRAY_RETURN]] == ["ReturnIntent", "Returned"]
    assert str(by_op[STRAY_RETURN][0].fact.epoch) == seen["daemon_epoch"]
    assert [type(c.fact).__name__ for c in by_op[MATCH_ADOPT]] == ["OrphanAdopted"]
    assert by_op[MATCH_ADOPT][0].fact.hostname == "node-match"
    assert [type(c.fact).__name__ for c in by_op[direct_op]] == ["ReturnIntent", "Returned"]
    assert by_op[direct_op][0].fact.epoch > by_op[STRAY_RETURN][0].fact.epoch  # the command's own, later lease
    assert seen["leases"] == []  # the direct path gave its lease back
    # The provider: the stray returned by the daemon, the i-direct one only after the daemon stopped.
    machines_mid, machines = seen["state_mid"]["machines"], seen["state_after"]["machines"]
    assert machines_mid["i-stray"]["state"] == "terminated" and machines_mid["i-direct"]["state"] == "running"
    assert machines["i-direct"]["state"] == "terminated"
    assert (
        machines["i-protected"]["state"]
        == machines["i-untagged"]["state"]
        == machines["i-match"]["state"]
        == ("running")
    )
    # The audit: the daemon's events log holds both paths' actions, each saying who confirmed it and through what.
    actions = [
        (e["machine_id"], e["confirmed_by"]["via"], e["confirmed_by"]["identity"])
        for e in seen["events"]
        if e["event"] == "orphan_action"
    ]
    assert actions == [
        ("i-stray", "daemon", "prov-main"),
        ("i-match", "daemon", "prov-main"),
        ("i-direct", "direct", "prov-main-orphans-admin"),
    ]
    everything = seen["events_text"] + seen["log"]
    everything += "".join(r.stdout + r.stderr for r in outputs.values())
    assert SECRET not in everything
