"""Handover without a gap, with real processes on loopback (issue 22 item 5).

The reference controller runs as a process (mutual TLS); two ``provisionerd run`` processes serve one provider with
the same identity (one config on two hosts: each its own state directory). The holder's SIGTERM releases the lease;
the controller pushes ``LeaseFreed`` to the standby, which acquires at once (measured: ``lease_acquired`` of the
standby against ``daemon_stopping`` of the holder, both wall clocks of this host). A second start of the holder's
own config while it runs is refused (exit 2, naming the holder's pid), and the holder keeps answering ``status``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
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

pytestmark = pytest.mark.process

#: The controller's lease: long enough that waiting out a hint (up to the whole TTL) could never pass for a push.
TTL = 10.0


def daemon_config(certs: Path, addresses: tuple[str, ...], state: Path, plugin: Path) -> Config:
    return Config(
        cluster="testcluster",
        identity="prov-ha",
        controller=ControllerSettings(
            addresses,
            connect_timeout=3,
            request_timeout=3,
            heartbeat_interval=0.5,
            heartbeat_timeout=3,
            backoff=Backoff(initial=0.1, max=1),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=1.0),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
        providers=(ProviderConfig("sim", "oneshot", path=plugin),),
    )


async def status_of(sock: Path) -> dict | None:
    try:
        reply = await trio.to_thread.run_sync(query, sock)
    except (OSError, ValueError):
        return None
    return reply["status"] if reply.get("ok") else None


async def poll_status(sock: Path, predicate, limit: float = 30.0) -> dict:
    with trio.fail_after(limit):
        while True:
            status = await status_of(sock)
            if status is not None and predicate(status):
                return status
            await trio.sleep(0.05)


def events_of(state: Path) -> list[dict]:
    return [json.loads(line) for line in (state / "events.jsonl").read_text().splitlines()]


def held(status: dict) -> bool:
    return status["leases"][0]["state"] == "held"


def test_sigterm_of_the_holder_hands_the_lease_over_and_a_second_start_is_refused(tmp_path: Path) -> None:
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller_process

    certs = tmp_path / "certs"
    init_certs(certs, "testcluster")
    plugin = tmp_path / "plugins" / "sim"
    plugin.mkdir(parents=True)
    (plugin / "describeProvider.sh").write_text("#!/bin/sh\nexit 1\n")
    (plugin / "describeProvider.sh").chmod(0o755)
    seen: dict = {}

    async def start(config: Path, log: Path) -> trio.Process:
        with open(log, "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a real file
            return await trio.lowlevel.open_process(
                [sys.executable, "-m", "provisionerd", "run", "--config", str(config)],
                start_new_session=True,
                stderr=log_file,
            )

    async def main() -> None:
        async with open_refcontroller_process(
            certs, tmp_path / "ctl", replicas=1, lease_ttl=TTL, check_interval=0.5, heartbeat_timeout=5.0
        ) as ctl:
            addresses = tuple(ctl.addresses)
            states = [tmp_path / "a", tmp_path / "b"]
            configs = [tmp_path / "a.toml", tmp_path / "b.toml"]
            for state, config in zip(states, configs, strict=True):
                write_daemon_config(daemon_config(certs, addresses, state, plugin), config)
            procs = []
            try:
                procs.append(await start(configs[0], tmp_path / "a.log"))
                first = await poll_status(states[0] / "admin.sock", held)
                seen["first"] = first
                # The same config again, while the first runs: refused, the first keeps its socket.
                again = await start(configs[0], tmp_path / "a-again.log")
                procs.append(again)
                with trio.fail_after(20):
                    seen["again_rc"] = await again.wait()
                seen["again_err"] = (tmp_path / "a-again.log").read_text()
                seen["first_after"] = await poll_status(states[0] / "admin.sock", held, limit=5)
                # The standby: another state directory, the same identity and provider.
                procs.append(await start(configs[1], tmp_path / "b.log"))
                await poll_status(states[1] / "admin.sock", lambda s: s["link"]["state"] == "up")
                with trio.fail_after(20):
                    while not any(e["event"] == "lease_denied" for e in events_of(states[1])):  # noqa: ASYNC110 - another process writes it
                        await trio.sleep(0.05)
                await trio.sleep(1.0)  # the standby now sleeps on its hint (the lease has most of its TTL left)
                procs[0].send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    seen["holder_rc"] = await procs[0].wait()
                seen["standby"] = await poll_status(states[1] / "admin.sock", held, limit=TTL)
                seen["controller"] = await ctl.status()
                procs[2].send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    await procs[2].wait()
            finally:
                for proc in procs:
                    if proc.returncode is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        await proc.wait()
            seen["pids"] = [proc.pid for proc in procs]

    trio.run(main)
    holder_pid, again_pid, standby_pid = seen["pids"]
    # The second start of one config: exit 2 and a message naming the process that holds the socket.
    assert seen["again_rc"] == 2
    assert f"in use by process {holder_pid}" in seen["again_err"], seen["again_err"]
    assert seen["first_after"]["process"]["pid"] == holder_pid
    a_events, b_events = events_of(tmp_path / "a"), events_of(tmp_path / "b")
    assert {e["process"]["pid"] for e in a_events} == {holder_pid}  # nothing from the refused start
    assert {e["process"]["instance"] for e in a_events} == {seen["first"]["link"]["instance"]}
    assert {e["process"]["pid"] for e in b_events} == {standby_pid}
    # The handover: SIGTERM of the holder -> the standby holds, within 0.5 s, without waiting out its hint.
    assert seen["holder_rc"] == 0
    stopping = next(e["ts"] for e in a_events if e["event"] == "daemon_stopping")
    acquired = next(e["ts"] for e in b_events if e["event"] == "lease_acquired")
    gap = acquired - stopping
    print(f"handover: standby held {gap * 1000:.0f} ms after the holder's SIGTERM")
    assert 0 < gap < 0.5, gap
    assert any(e["event"] == "lease_freed" for e in b_events)
    denial = next(e for e in b_events if e["event"] == "lease_denied")
    assert denial["reason"] == "held" and denial["retry_after"] > 3
    (lease,) = seen["controller"]["leases"]
    assert lease["holder"] == f"prov-ha#{seen['standby']['link']['instance']}"
