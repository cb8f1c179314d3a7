"""Issue 20 items 1-2 with real processes: the reference controller (in this process, real mutual-TLS sockets),
``provisionerd run`` and the local provider's plugin and agents (processes, the real clock).

The local provider's templates declare one GPU; each agent runs its template's probe (``--probe ngpus=...``, from
the plugin's own ``local.json``) and reports what it printed in its Join. ``gpu-bad`` (the cheaper, chosen first)
probes ``echo 0``; ``gpu-good`` probes ``echo 1``.

1. Demand 1 GPU machine: the ``gpu-bad`` machine joins, is returned with ``capability_mismatch: ngpus 0 < 1
   required`` in its ReturnIntent, and the demand is met by a ``gpu-good`` machine.
2. ``max_unhealthy = 1``, only ``gpu-bad`` offered (``capacity_backoff = 1``: without the protection the daemon
   would ask again every second), demand 3: three bad machines come back, replacement stops, and ``provisionerd
   status`` says why; no request is made for the next seconds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_procs import live_agents

from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import DemandItem, RequestIntent, ResourceShape, Returned, ReturnIntent
from refcontroller.api import RefController, open_refcontroller

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "providers" / "local"
GPU = ResourceShape(ncpus=1, gpus=1)


def template(template_id: str, price: float, gpus_seen: str) -> dict[str, Any]:
    return {
        "templateId": template_id,
        "maxNumber": 8,
        "ncpus": 1,
        "memMb": 64,
        "ngpus": 1,
        "price": price,
        "probes": {"ngpus": f"echo {gpus_seen}"},
        "reportHost": True,  # ncpus 1, mem 64 MiB: this host has them, so only the GPU probe can fall short
    }


def write_config(path: Path, certs: Path, ctl: RefController, conf: Path, data: Path, state: Path, extra: str) -> None:
    path.write_text(f"""
cluster = "agentcluster"
identity = "prov-health"
[controller]
addresses = {json.dumps(list(ctl.addresses))}
heartbeat_interval = 0.5
heartbeat_timeout = 5
request_timeout = 5
connect_timeout = 5
backoff = {{initial = 0.1, max = 0.5, multiplier = 2, jitter = 0.5}}
[tls]
ca = "{certs}/ca.pem"
cert = "{certs}/provisioner.pem"
key = "{certs}/provisioner.key"
[lease]
margin = 0.5
[daemon]
events_log = "{state}/events.jsonl"
admin_socket = "{state}/admin.sock"
[[providers]]
name = "local"
transport = "oneshot"
path = "{LOCAL}"
conf_dir = "{conf}"
data_dir = "{data}"
idle_time = 0
{extra}
""")


@asynccontextmanager
async def fleet(tmp_path: Path, certs: Path, templates: list[dict[str, Any]], extra: str = "") -> AsyncIterator[Any]:
    """The controller, the daemon (its lease held) and the local provider; on exit, demand 0, every agent gone."""
    conf, data, config_path = tmp_path / "conf", tmp_path / "data", tmp_path / "pd.toml"
    state = Path(tempfile.mkdtemp(prefix="pd-hl-", dir="/tmp"))  # a unix socket path must be short
    conf.mkdir()
    data.mkdir()
    local = {"templates": templates, "certsDir": str(certs), "heartbeatSeconds": 1, "replyTimeoutSeconds": 3}
    (conf / "local.json").write_text(json.dumps(local))
    async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl:
        write_config(config_path, certs, ctl, conf, data, state, extra)
        with open(tmp_path / "daemon.log", "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a real file
            daemon = await trio.lowlevel.open_process(
                [sys.executable, "-m", "provisionerd", "run", "--config", str(config_path)],
                start_new_session=True,
                stderr=log_file,
                cwd=str(ROOT),
            )
        rig = Rig(ctl, state / "admin.sock", tmp_path)
        try:
            await rig.until(lambda: rig.status() is not None and rig.lease_held(), 60, "the lease")
            yield rig
            await ctl.set_demand([])
            with trio.move_on_after(30):
                while live_agents(str(tmp_path)):  # noqa: ASYNC110 - polls the agents' processes
                    await trio.sleep(0.2)
            daemon.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await daemon.wait() == 0, (tmp_path / "daemon.log").read_text()[-3000:]
        finally:
            if daemon.returncode is None:
                os.killpg(daemon.pid, signal.SIGKILL)
                await daemon.wait()


async def within(seconds: float, main: Callable[[], Any]) -> None:
    with trio.fail_after(seconds):
        await main()


class Rig:
    def __init__(self, ctl: RefController, sock: Path, tmp_path: Path) -> None:
        self.ctl, self.sock, self.tmp_path = ctl, sock, tmp_path

    def facts(self, kind: type) -> list[Any]:
        return [(c.index, c.fact) for c in self.ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]

    def status(self) -> dict[str, Any] | None:
        try:
            reply = query(self.sock)
        except (OSError, ValueError):
            return None
        return reply["status"] if reply and reply.get("ok") else None

    def lease_held(self) -> bool:
        status = self.status()
        return status is not None and status["leases"][0]["state"] == "held"

    def hosts(self) -> dict[str, Any]:
        return {h.instance_ref: h for h in self.ctl.server.cluster.hosts.all()}

    async def until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        with trio.move_on_after(timeout) as scope:
            while not predicate():  # noqa: ASYNC110 - other processes change what is polled
                await trio.sleep(0.1)
        if scope.cancelled_caught:
            log = (self.tmp_path / "daemon.log").read_text()[-4000:]
            raise AssertionError(f"timed out waiting for {what}\n{log}")


def test_a_machine_whose_probe_reports_0_gpus_is_returned_with_the_reason_and_replaced(
    certs: Path, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        templates = [template("gpu-bad", 0.1, "0"), template("gpu-good", 0.2, "1")]
        async with fleet(tmp_path, certs, templates) as rig:
            started = time.monotonic()
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 1)])

            hosts_seen: dict[str, Any] = {}
            seen["hosts"] = hosts_seen

            def met() -> bool:
                hosts_seen.update(rig.hosts())  # a returned machine's host is dropped with its lifecycle
                returned = {m for _, f in rig.facts(Returned) for m in f.machine_ids}
                good = [h for h in rig.hosts().values() if h.capabilities.get("ngpus") == "1"]
                return bool(returned) and len(good) == 1 and good[0].status.value == "idle"

            await rig.until(met, 90, "the bad machine returned and a good one joined")
            seen["seconds"] = time.monotonic() - started
            seen["intents"] = [f for _, f in rig.facts(RequestIntent)]
            seen["returns"] = [f for _, f in rig.facts(ReturnIntent)]
            await trio.sleep(3)  # the demand stays met: nothing more is asked or returned
            seen["intents_later"] = len(rig.facts(RequestIntent))
            seen["returns_later"] = len(rig.facts(ReturnIntent))
            seen["events"] = [json.loads(line) for line in (rig.sock.parent / "events.jsonl").read_text().splitlines()]

    trio.run(within, 180, main)
    assert [(i.template_id, i.count) for i in seen["intents"]] == [("gpu-bad", 1), ("gpu-good", 1)]
    (back,) = seen["returns"]
    assert back.reason == "capability_mismatch: ngpus 0 < 1 required"
    bad_host = next(h for h in seen["hosts"].values() if h.capabilities.get("ngpus") == "0")
    assert back.machine_ids == (bad_host.machine_id,)
    assert set(bad_host.capabilities) == {"ncpus", "mem", "type", "ngpus"}
    assert seen["intents_later"] == 2 and seen["returns_later"] == 1
    notes = [e for e in seen["events"] if e["event"] == "plan_note" and e["kind"] == "capability_mismatch"]
    assert notes and "ngpus 0 < 1 required" in notes[0]["detail"]
    print(f"bad machine returned and demand met by a good one in {seen['seconds']:.2f} s")


def test_with_max_unhealthy_1_three_bad_machines_stop_replacement_and_status_says_why(
    certs: Path, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        extra = "max_unhealthy = 1\nmax_unhealthy_window = 600\ncapacity_backoff = 1"
        async with fleet(tmp_path, certs, [template("gpu-bad", 0.1, "0")], extra) as rig:
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 3)])

            def protected() -> bool:
                status = rig.status()
                machines = None if status is None else status["providers"]["local"]["health"].get("machines")
                seen["machines"] = machines
                return bool(machines and machines["protected"])

            await rig.until(protected, 90, "the provider protected")
            intents = len(rig.facts(RequestIntent))
            await rig.until(
                lambda: (
                    not any(h.status.value != "lost" for h in rig.hosts().values()) and not live_agents(str(tmp_path))
                ),
                60,
                "every bad machine returned",
            )
            await trio.sleep(5)  # five suspect back-offs: without the protection the daemon would ask again
            seen["intents_before"] = intents
            seen["intents_after"] = [f for _, f in rig.facts(RequestIntent)]
            seen["returns"] = [f for _, f in rig.facts(ReturnIntent)]
            seen["status"] = rig.status()
            seen["events"] = [json.loads(line) for line in (rig.sock.parent / "events.jsonl").read_text().splitlines()]

    trio.run(within, 200, main)
    machines = seen["machines"]
    assert machines["unhealthy"] >= 2 and machines["max_unhealthy"] == 1
    assert "more than max_unhealthy 1: replacement stopped" in machines["reason"]
    assert len(seen["intents_after"]) == seen["intents_before"]  # replacement stopped
    asked = sum(i.count for i in seen["intents_after"])
    returned = {m for r in seen["returns"] for m in r.machine_ids}
    assert asked >= 3 and len(returned) == asked  # every bad machine went back
    assert all(r.reason == "capability_mismatch: ngpus 0 < 1 required" for r in seen["returns"])
    health = seen["status"]["providers"]["local"]["health"]["machines"]
    assert health["protected"] is True and health["eases_in_s"] > 500 and health["unhealthy"] == asked
    flagged = [e for e in seen["events"] if e["event"] == "plan_note" and e["kind"] == "provider_protected"]
    assert flagged and "replacement stopped" in flagged[-1]["detail"]
    print(f"protected after {asked} bad machines: {machines['reason']}")
