"""Replicas as real processes on a real three-member etcd (issue 22 items 1-2 and 4).

Three ``refcontroller serve --store etcd://... --listen 127.0.0.1:0`` processes elect their primary through etcd;
one ``provisionerd run`` is given all three addresses. kill -9 of the primary process: another replica is primary
within a few seconds (the claim's etcd lease, 2 s, plus a campaign interval), the daemon rejoins it (redirected by
whichever replica it reaches), the new primary re-grants the lease to the same holder at once, inside its grace,
with a higher epoch, and the daemon sees the same incarnation and no lower fact index (no amnesia). Measured figures
are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import trio

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    ProviderConfig,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import Epoch
from refcontroller.admin import AdminClient, AdminError

pytestmark = pytest.mark.integration

TTL, CHECK = 4.0, 1.0


async def start_replica(certs: Path, store: str, log: Path) -> tuple[trio.Process, str]:
    argv = [sys.executable, "-m", "refcontroller", "serve", "--certs", str(certs), "--store", store]
    argv += ["--listen", "127.0.0.1:0", "--lease-ttl", str(TTL), "--check-interval", str(CHECK)]
    argv += ["--heartbeat-timeout", "5", "--etcd-lease-ttl", "2"]
    with open(log, "wb") as err:  # noqa: ASYNC230 - the child's stderr needs a real file
        proc = await trio.lowlevel.open_process(argv, stdout=-1, stderr=err, start_new_session=True)
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(30):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            assert chunk, f"replica exited early: see {log}"
            line += chunk
    ready = json.loads(line)
    assert ready["ready"] and ready["store"] == "etcd"
    return proc, ready["listen"][0]


async def primary_status(admin: AdminClient, limit: float = 20.0) -> dict:
    with trio.fail_after(limit):
        while True:
            try:
                status = await admin.status()
                if status["term"] >= 1:
                    return status
            except (AdminError, OSError):
                pass
            await trio.sleep(0.1)


async def daemon_status(sock: Path, predicate, limit: float = 30.0) -> dict:
    with trio.fail_after(limit):
        while True:
            try:
                reply = await trio.to_thread.run_sync(query, sock)
            except (OSError, ValueError):
                reply = None
            if reply and reply.get("ok") and predicate(reply["status"]):
                return reply["status"]
            await trio.sleep(0.05)


def held(status: dict) -> bool:
    return status["leases"][0]["state"] == "held"


def _setup(tmp_path: Path, etcd_endpoints) -> tuple[Path, Path, str]:
    from provisionerd.pki.certs import init_certs

    certs = tmp_path / "certs"
    init_certs(certs, "testcluster")
    plugin = tmp_path / "plugins" / "sim"
    plugin.mkdir(parents=True)
    (plugin / "describeProvider.sh").write_text("#!/bin/sh\nexit 1\n")
    (plugin / "describeProvider.sh").chmod(0o755)
    return certs, plugin, "etcd://" + ",".join(e.removeprefix("http://") for e in etcd_endpoints)


async def _run(tmp_path: Path, certs: Path, plugin: Path, store: str, fault, seen: dict, provider=None) -> None:
    """Three replicas and one daemon; ``await fault(replicas, primary_address, daemon_status_of)`` in between."""
    replicas: dict[str, trio.Process] = {}
    daemon = None
    try:
        for i in range(3):
            proc, address = await start_replica(certs, store, tmp_path / f"replica{i}.log")
            replicas[address] = proc
        addresses = tuple(replicas)
        admin = AdminClient(certs, addresses, timeout=3)
        seen["first_ctl"] = await primary_status(admin)
        state = tmp_path / "state"
        config = Config(
            cluster="testcluster",
            identity="prov-etcd",
            controller=ControllerSettings(
                addresses,
                connect_timeout=2,
                request_timeout=2,
                heartbeat_interval=0.3,
                heartbeat_timeout=1.5,
                backoff=Backoff(initial=0.1, max=0.5),
            ),
            tls=provisioner_tls(certs),
            lease=LeaseSettings(margin=0.5),
            daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
            providers=(provider or ProviderConfig("sim", "oneshot", path=plugin),),
        )
        write_daemon_config(config, tmp_path / "pd.toml")
        if "demand" in seen:
            await admin.set_demand(seen["demand"])
        with open(tmp_path / "daemon.log", "wb") as err:  # noqa: ASYNC230
            daemon = await trio.lowlevel.open_process(
                [sys.executable, "-m", "provisionerd", "run", "--config", str(tmp_path / "pd.toml")],
                start_new_session=True,
                stderr=err,
            )
        before = await daemon_status(state / "admin.sock", held)
        seen["before"] = before
        primary = before["link"]["primary"]
        assert primary in replicas
        await fault(replicas, primary)
        old = Epoch.parse(before["leases"][0]["epoch"])
        t0 = time.monotonic()
        after = await daemon_status(
            state / "admin.sock",
            lambda s: held(s) and s["link"]["primary"] != primary and Epoch.parse(s["leases"][0]["epoch"]) > old,
        )
        seen["regained_s"] = seen.get("fault_s", 0.0) + time.monotonic() - t0
        seen["after"] = after
        # Asked of the other replicas (a stopped one accepts TCP but never completes TLS).
        others = AdminClient(certs, tuple(a for a in addresses if a != primary), timeout=3)
        seen["second_ctl"] = await primary_status(others)
        seen["replicas"] = replicas
        seen["others"] = others
        if "after_fault" in seen:
            await seen["after_fault"](replicas, primary, state)
    finally:
        if daemon is not None and daemon.returncode is None:
            daemon.send_signal(signal.SIGTERM)
            with trio.move_on_after(10):
                await daemon.wait()
            if daemon.returncode is None:
                os.killpg(daemon.pid, signal.SIGKILL)
                await daemon.wait()
        for proc in replicas.values():
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
                with trio.move_on_after(5):
                    await proc.wait()
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()


def _check_handover(seen: dict, tmp_path: Path) -> None:
    before, after, ctl = seen["before"], seen["after"], seen["second_ctl"]
    assert after["link"]["term"] > before["link"]["term"]
    assert after["link"]["instance"] == before["link"]["instance"]  # the same process holds it again
    assert Epoch.parse(after["leases"][0]["epoch"]).term == ctl["term"]  # granted by the new primary
    assert ctl["incarnation"] == seen["first_ctl"]["incarnation"]  # one log, whichever replica serves it
    (lease,) = ctl["leases"]
    assert lease["holder"] == f"prov-etcd#{before['link']['instance']}"
    assert after["controller"]["halted"] is False  # no amnesia found
    events = [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "controller_amnesia"]


def test_kill_9_of_the_primary_replica_process(tmp_path: Path, etcd_endpoints) -> None:
    certs, plugin, store = _setup(tmp_path, etcd_endpoints)
    seen: dict = {}

    async def kill(replicas: dict[str, trio.Process], primary: str) -> None:
        os.killpg(replicas[primary].pid, signal.SIGKILL)
        await replicas[primary].wait()

    trio.run(_run, tmp_path, certs, plugin, store, kill, seen)
    print(f"kill -9 of the primary replica: the daemon held the lease again after {seen['regained_s']:.2f} s")
    assert seen["regained_s"] < 2 + CHECK + TTL  # well inside the new primary's grace: the same holder, at once
    assert seen["second_ctl"]["grace_remaining_s"] > 0  # re-granted inside the grace: only the last grantee could be
    _check_handover(seen, tmp_path)


def test_sigstop_of_the_primary_past_its_etcd_lease(tmp_path: Path, etcd_endpoints) -> None:
    """The stopped primary loses its claim; on SIGCONT it finds its quorum stale and its claim gone: it steps down
    without a grant or commit (its log says so), and the lease the daemon holds is the new primary's."""
    certs, plugin, store = _setup(tmp_path, etcd_endpoints)
    seen: dict = {}

    async def stop(replicas: dict[str, trio.Process], primary: str) -> None:
        os.killpg(replicas[primary].pid, signal.SIGSTOP)
        seen["stopped"] = primary

    async def wake(replicas: dict[str, trio.Process], primary: str, state: Path) -> None:
        os.killpg(replicas[primary].pid, signal.SIGCONT)
        log = tmp_path / f"replica{list(replicas).index(primary)}.log"
        with trio.fail_after(10):
            while "stepping down" not in log.read_text():  # noqa: ASYNC110, ASYNC240 - another process writes it
                await trio.sleep(0.1)
        seen["woken_log"] = log.read_text()
        seen["after_wake"] = await daemon_status(state / "admin.sock", held)

    seen["after_fault"] = wake
    trio.run(_run, tmp_path, certs, plugin, store, stop, seen)
    print(f"SIGSTOP of the primary replica: the daemon held the lease again after {seen['regained_s']:.2f} s")
    _check_handover(seen, tmp_path)
    woken = seen["woken_log"]
    assert "lost the primary claim" in woken or "deposed" in woken
    # After the old primary woke, the daemon still holds the new primary's lease (never one the old one granted).
    assert Epoch.parse(seen["after_wake"]["leases"][0]["epoch"]).term == seen["second_ctl"]["term"]


def test_kill_9_of_the_primary_while_10_machines_are_requested(tmp_path: Path, etcd_endpoints) -> None:
    """Demand for 10 machines of the simulated provider (real plugin processes); the primary replica is killed once
    the first machines exist. The daemon finishes on the new primary: 10 machines, each created once (no op_id
    twice), each explained by a committed instance fact, none lost from the log."""
    from provisionerd.domain.model import DemandItem, ResourceShape

    certs, plugin, store = _setup(tmp_path, etcd_endpoints)
    data = tmp_path / "sim-data"
    seen: dict = {"demand": [DemandItem(demand_id="d1", shape=ResourceShape(ncpus=8), count=10)]}
    root = Path(__file__).resolve().parents[2]
    provider = ProviderConfig("sim", "oneshot", path=root / "providers" / "simulated", data_dir=data)

    def machines() -> dict:
        path = data / "state.json"
        return json.loads(path.read_text())["machines"] if path.exists() else {}

    async def kill_mid_request(replicas: dict[str, trio.Process], primary: str) -> None:
        with trio.fail_after(30):
            while not machines():  # noqa: ASYNC110 - the plugin process writes it
                await trio.sleep(0.02)
        seen["machines_at_kill"] = len(machines())
        os.killpg(replicas[primary].pid, signal.SIGKILL)
        await replicas[primary].wait()

    async def settle(replicas: dict[str, trio.Process], primary: str, state: Path) -> None:
        with trio.fail_after(60):
            while True:
                status = await seen["others"].status()
                instances = status["facts"]["live"]
                if len(machines()) >= 10 and instances >= 10:
                    break
                await trio.sleep(0.2)
        await trio.sleep(2.0)  # a duplicate request would show up meanwhile
        seen["final_machines"] = machines()
        seen["final_ctl"] = await seen["others"].status()

    seen["after_fault"] = settle
    trio.run(_run, tmp_path, certs, plugin, store, kill_mid_request, seen, provider)
    print(
        f"kill -9 once {seen['machines_at_kill']} of 10 machines existed (before their facts):"
        f" lease again after {seen['regained_s']:.2f} s;"
        f" {len(seen['final_machines'])} machines in the end"
    )
    _check_handover(seen, tmp_path)
    final = seen["final_machines"]
    assert len(final) == 10, final.keys()
    assert len({m["tags"]["provisionerd:op"] for m in final.values()}) == 1  # one op_id, created once
    # The log in etcd (the truth, whichever replica serves it): one intent, one instance fact per machine.
    from provisionerd.domain.model import InstanceFact, RequestIntent
    from refcontroller.jsonconv import fact_from_json
    from refcontroller.store_etcd_client import EtcdClient

    client = EtcdClient(etcd_endpoints)
    try:
        entries = [
            json.loads(kv.value) for kv in client.range_from(b"provisionerd/ops/0", b"provisionerd/ops/:", 10_000)
        ]
    finally:
        client.close()
    facts = [fact_from_json(e["args"][0]) for e in entries if e["op"] == "append"]
    intents = [f for f in facts if isinstance(f, RequestIntent)]
    instances = [f for f in facts if isinstance(f, InstanceFact)]
    assert len(intents) == 1 and intents[0].count == 10
    assert sorted(f.machine_id for f in instances) == sorted(final)  # every machine explained, none twice
    assert seen["final_ctl"]["facts"]["count"] == len(facts)
