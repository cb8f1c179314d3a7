"""Metrics, /healthz and /readyz of the real ``DaemonCore`` (session, keeper, loop, executor) against the reference
controller over in-memory streams, on MockClock; the HTTP handler is driven over in-memory streams too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from rigs.memory import memory_config, memory_core, running

from provisionerd.cli.status import render
from provisionerd.config.loader import Config
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.errors import AuthFailed
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider


def config(tmp_path: Path, addresses, identity: str = "prov-1") -> Config:
    return memory_config(tmp_path, addresses, identity=identity, metrics_listen="127.0.0.1:0")


async def get(core: DaemonCore, path: str, request: bytes | None = None) -> tuple[int, bytes]:
    """One request to the daemon's HTTP handler over an in-memory stream: ``(status, body)``."""
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(core.observability.server.handle, server)
        await client.send_all(request if request is not None else f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await client.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


class WatchedEventLog(EventLog):
    """An events log that also hands each record to ``watch`` (the test's observer; set before the run)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.watchers: list = []

    def emit(self, event: str, **fields):
        record = super().emit(event, **fields)
        for watch in self.watchers:
            watch(record)
        return record


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by prometheus_client's own parser: (name, labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_readyz_turns_ready_only_once_the_lease_is_held_and_the_view_resynced_after_the_grant(
    tmp_path, memory_controller, mock_run
):
    events = WatchedEventLog()
    seen: dict = {"trail": []}

    async def main():
        async with memory_controller(replicas=1) as net:
            core = memory_core(net, config(tmp_path, net.addresses), FakeProvider("sim"), events=events)

            def ready() -> tuple[bool, bool, bool]:
                ok, _ = core.observability.snapshot.ready(trio.current_time())
                return ok, core.keepers["sim"].valid(), core.session.synced_for("sim")

            def note(record):  # after every event: is the daemon ready, and is it held and resynced
                # At the grant (its reply asked for a resync): the lease is held, the view predates it.
                name = "granted" if record["event"] == "lease_acquired" else record["event"]
                seen["trail"].append((name, *ready()))

            events.watchers.append(note)
            async with running(core):
                seen["before"] = await get(core, "/readyz")
                await trio.sleep(40)
                seen["after"] = await get(core, "/readyz")
                seen["health"] = await get(core, "/healthz")

    mock_run(main)
    trail = seen["trail"]
    status, body = seen["before"]
    assert status == 503 and json.loads(body)["ready"] is False  # not joined yet
    assert seen["after"][0] == 200 and json.loads(seen["after"][1]) == {"ready": True, "reasons": []}
    assert seen["health"][0] == 200 and seen["health"][1].startswith(b"ok: the reconcile loop turned")
    first = next(i for i, (_, ok, _, _) in enumerate(trail) if ok)
    names = [e for e, *_ in trail]
    # Not ready at the join's resync (no lease yet), nor at the grant (the view predates it): only at the resync the
    # grant asked for (a refresh on the same link).
    assert "resync" in names[:first] and names.index("granted") < first and names[first] == "refresh"
    assert trail[names.index("granted")] == ("granted", False, True, False)
    assert all(valid and synced for _, ok, valid, synced in trail if ok)


def test_a_standby_daemon_is_ready_and_two_daemons_in_one_process_keep_their_own_metrics(
    tmp_path, memory_controller, mock_run
):
    seen: dict = {}

    async def main():
        async with memory_controller(replicas=1) as net:
            fake = FakeProvider("sim")
            active = memory_core(net, config(tmp_path, net.addresses, "prov-1"), fake)
            standby = memory_core(net, config(tmp_path, net.addresses, "prov-2"), FakeProvider("sim"))
            async with running(active) as nursery:
                await trio.sleep(40)
                await nursery.start(standby.run)
                await trio.sleep(40)
                fake.fail_next("getAvailableTemplates", AuthFailed("sim", "getAvailableTemplates", "key revoked"))
                active.feed.refresh_soon()
                await trio.sleep(1)
                seen["active"] = await get(active, "/metrics")
                seen["standby"] = await get(standby, "/metrics")
                seen["standby_ready"] = await get(standby, "/readyz")
                seen["status"] = active.status()
                seen["standby_status"] = standby.status()

    mock_run(main)
    assert seen["standby_ready"][0] == 200  # another holder has the lease: deliberately on standby
    active, standby = (samples(seen[k][1].decode()) for k in ("active", "standby"))
    held = ("provisionerd_lease_state", (("provider", "sim"), ("state", "held")))
    assert active[held] == 1.0 and standby[held] == 0.0
    assert standby[("provisionerd_lease_standby", (("provider", "sim"),))] == 1.0
    assert active[("provisionerd_lease_epoch_term", (("provider", "sim"),))] >= 1.0
    assert active[("provisionerd_link_state", (("state", "up"),))] == 1.0
    assert active[("provisionerd_ready", ())] == 1.0 and standby[("provisionerd_ready", ())] == 1.0
    # Each daemon counts its own calls (private registries): the standby never read the active one's offers.
    calls = "provisionerd_provider_calls_total"
    ok = (calls, (("action", "getAvailableTemplates"), ("outcome", "ok"), ("provider", "sim")))
    refused = (calls, (("action", "getAvailableTemplates"), ("outcome", "auth_failed"), ("provider", "sim")))
    assert active[ok] >= 1 and active[refused] == 1.0
    assert standby.get(refused) is None
    latency = (
        "provisionerd_provider_call_duration_seconds_count",
        (("action", "getAvailableTemplates"), ("provider", "sim")),
    )
    assert active[latency] == active[ok] + active[refused]
    assert active[("provisionerd_resyncs_total", (("kind", "join"),))] >= 1
    assert active[("provisionerd_provider_unhealthy", (("code", "auth_failed"), ("provider", "sim")))] == 1.0
    assert active[("provisionerd_backoffs_active", (("kind", "unhealthy"), ("provider", "sim")))] == 1.0
    # status: the four checks kept apart; access failed, the plugin answers, nothing waits to join.
    sim = seen["status"]["providers"]["sim"]
    assert sim["checks"]["access"]["state"] == "failed" and "key revoked" in sim["checks"]["access"]["detail"]
    assert sim["checks"]["connectivity"]["state"] == "ok"
    assert sim["checks"]["readiness"]["state"] == "ok"
    assert sim["last_call"]["action"] == "getAvailableTemplates" and sim["last_call"]["outcome"] == "auth_failed"
    assert sim["health"]["state"] == "unhealthy" and sim["backoffs"]["unhealthy"] == 1
    # The offers read before the key was revoked are kept (issue 31 finding 5); the provider is read by its probe.
    capacity = sim["checks"]["capacity"]
    assert capacity["state"] == "limited" and capacity["detail"].startswith("the last read failed (auth_failed)")
    assert capacity["detail"].endswith("kept (still used); read again at its next probe")
    # The same, for people: one block per provider, the four checks on their own lines.
    lines = render(seen["status"])
    assert "provider 'sim': lease held  epoch 1.1" in lines[2]
    assert any(line.startswith("  UNHEALTHY: auth_failed: key revoked  (1 failures, next probe in") for line in lines)
    assert re.search(r"^  access +failed +auth_failed: key revoked$", "\n".join(lines), re.M)
    assert re.search(r"^  connectivity +ok +getAvailableTemplates answered auth_failed", "\n".join(lines), re.M)
    assert "STANDBY (another holder has it)" in render(seen["standby_status"])[2]


def test_the_http_handler_bounds_what_it_reads_and_counts_each_refusal(tmp_path, memory_controller, mock_run):
    seen: dict = {}

    async def main():
        async with memory_controller(replicas=1) as net:
            core = memory_core(net, config(tmp_path, net.addresses), FakeProvider("sim"))
            server = core.observability.server
            seen["big"] = await get(core, "", b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n")
            seen["post"] = await get(core, "", b"POST /metrics HTTP/1.1\r\n\r\n")
            seen["junk"] = await get(core, "", b"\x16\x03\x01 hello\r\n\r\n")
            seen["missing"] = await get(core, "/nope")
            # A slow client: the head never ends; the handler gives up after its read timeout (trio's clock).
            client, server_side = trio.testing.memory_stream_pair()
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.handle, server_side)
                await client.send_all(b"GET /metrics HTTP/1.1\r\n")
                data = b""
                while chunk := await client.receive_some(65536):
                    data += chunk
            seen["slow"] = (data.split(b" ")[1], trio.current_time() - started)
            seen["metrics"] = samples(core.observability.metrics.render().decode())

    mock_run(main)
    assert seen["big"][0] == 431 and seen["post"][0] == 405 and seen["junk"][0] == 400 and seen["missing"][0] == 404
    assert seen["slow"] == (b"408", 5.0)
    refusals = {
        dict(labels)["reason"]: v
        for (name, labels), v in seen["metrics"].items()
        if name == "provisionerd_http_refusals_total"
    }
    assert refusals == {"too_large": 1.0, "method": 1.0, "bad_request": 1.0, "not_found": 1.0, "timeout": 1.0}


def test_healthz_turns_unhealthy_when_the_reconcile_loop_stops_turning(tmp_path, memory_controller, mock_run):
    seen: dict = {}

    async def main():
        async with memory_controller(replicas=1) as net:
            core = memory_core(net, config(tmp_path, net.addresses), FakeProvider("sim"))
            async with running(core):
                await trio.sleep(40)
                seen["alive"] = await get(core, "/healthz")
                core.loop.beat = trio.current_time() - 31  # as if the loop were stuck for 31 s (limit: 30 s)
                seen["stuck"] = await get(core, "/healthz")

    mock_run(main)
    assert seen["alive"][0] == 200
    assert seen["stuck"][0] == 503 and b"has not turned for 31.0s" in seen["stuck"][1]


def test_an_address_in_use_stops_the_start_with_a_config_error_naming_the_key(tmp_path, memory_controller):
    import socket

    import pytest

    from provisionerd.domain.errors import ConfigError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]

    async def main():
        async with memory_controller(replicas=1) as net:
            base = config(tmp_path, net.addresses)
            cfg = attrs.evolve(base, daemon=attrs.evolve(base.daemon, metrics_listen=f"127.0.0.1:{port}"))
            core = memory_core(net, cfg, FakeProvider("sim"))
            with pytest.raises(ConfigError, match="daemon.metrics_listen: cannot listen on") as caught:
                await core.observability.serve()
            return caught.value

    try:
        error = trio.run(main)
    finally:
        taken.close()
    assert f"'127.0.0.1:{port}'" in str(error)


def test_scrapes_within_a_second_get_the_same_rendering(tmp_path, memory_controller, mock_run):
    seen: dict = {}

    async def main():
        async with memory_controller(replicas=1) as net:
            core = memory_core(net, config(tmp_path, net.addresses), FakeProvider("sim"))
            async with running(core):
                await trio.sleep(5)
                first = await get(core, "/metrics")
                core.calls.ended("sim", "listMachines", "timeout", 60.0)
                again = await get(core, "/metrics")
                await trio.sleep(1)
                later = await get(core, "/metrics")
                seen.update(first=first, again=again, later=later)

    mock_run(main)
    assert seen["again"] == seen["first"]  # the state is read at most once a second, whoever scrapes
    timeouts = (
        "provisionerd_provider_calls_total",
        (("action", "listMachines"), ("outcome", "timeout"), ("provider", "sim")),
    )
    assert timeouts not in samples(seen["first"][1].decode())
    assert samples(seen["later"][1].decode())[timeouts] == 1.0
