"""An HA pair's fleet metrics sum to the machines (issue 32 item 6), with real processes on loopback.

Two ``provisionerd run`` processes serve one provider with one identity (one config on two hosts: each its own
state directory and metrics address); the shipped simulated provider's cloud (one data directory) is shared, the
reference controller runs in this process on real mutual-TLS sockets. Both daemons read the same view of the
fleet; only the lease holder exports a provider's fleet gauges (``telemetry.metrics_snapshot``), so
``sum(provisionerd_machines)`` over both scrapes is the number of machines the cloud holds, not twice it. The spend
counter moves on the holder only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir, simulated_machines, simulated_provider
from rigs.metric_names import exported, queried

from provisionerd.domain.model import DemandItem, ResourceShape

pytestmark = pytest.mark.process

DASHBOARD = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "provisionerd.json"
MACHINES = 5
LINK = {"request_timeout": 3, "heartbeat_timeout": 3}
SPEND = ("provisionerd_estimated_spend_total", (("currency", "USD"), ("provider", "sim")))


async def scrape_text(address: str) -> str:
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    return data.partition(b"\r\n\r\n")[2].decode()


async def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = await scrape_text(address)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def test_an_ha_pairs_fleet_sum_equals_the_machines(tmp_path):
    from refcontroller.api import open_refcontroller

    seen: dict = {}

    async def main():
        certs = make_certs(tmp_path, "clu")
        sim = simulated_provider(tmp_path, sim={"delays": {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}})
        with short_dir("pd-ha-a-") as state_a, short_dir("pd-ha-b-") as state_b:
            async with (
                open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl,
                procs.open_procs() as started,
            ):
                daemons, addresses = [], []
                for name, state in (("a", state_a), ("b", state_b)):
                    metrics = f"127.0.0.1:{wait.free_port()}"
                    config = daemon_config(
                        certs,
                        ctl.addresses,
                        state,
                        sim,
                        cluster="clu",
                        identity="prov-ha",
                        link=LINK,
                        metrics_listen=metrics,
                    )
                    (tmp_path / name).mkdir()
                    daemons.append(Daemon.write(config, tmp_path / name / "pd.toml", started))
                    addresses.append(metrics)
                a, b = daemons
                await a.start()
                await a.wait_held(60)
                await b.start()
                await b.wait_status("b on standby", lambda s: s["providers"]["sim"]["lease"].get("standby") is True, 60)
                await ctl.set_demand([DemandItem("cpu", ResourceShape(ncpus=8), MACHINES)])

                def running() -> int:
                    return sum(1 for m in simulated_machines(sim).values() if m.get("state") == "running")

                await wait.until_sync("the cloud to hold the machines", lambda: running() == MACHINES or None, 60)

                async def agreed():
                    both = [await scrape(address) for address in addresses]
                    machines = [total(s, "provisionerd_machines") for s in both]
                    return (both, machines) if sum(machines) == MACHINES and machines[0] == MACHINES else None

                try:
                    seen["both"], seen["machines"] = await wait.until(
                        "the holder's gauges to count the fleet", agreed, 30
                    )
                except wait.WaitTimeout:
                    seen["both"] = [await scrape(address) for address in addresses]
                    raise
                seen["cloud"] = running()

                async def spent():  # once the instance facts carry the machines' price, the holder's counter moves
                    later = [await scrape(address) for address in addresses]
                    return later if later[0].get(SPEND, 0.0) > 0 else None

                seen["later"] = await wait.until("the holder's spend counter to move", spent, 30)
                seen["texts"] = [await scrape_text(address) for address in addresses]

    trio.run(main)
    holder, standby = seen["both"]
    assert seen["cloud"] == MACHINES
    assert seen["machines"] == [MACHINES, 0.0]  # the sum over the pair is the fleet, once
    assert not any(name == "provisionerd_machines" for name, _ in standby)  # the standby exports none of it
    assert total(holder, "provisionerd_demand_wanted_machines") == MACHINES
    held = ("provisionerd_lease_state", (("provider", "sim"), ("state", "held")))
    assert holder[held] == 1.0 and standby[held] == 0.0
    later_holder, later_standby = seen["later"]
    assert later_holder[SPEND] > 0  # 5 x 0.34 USD an hour, integrated on the holder
    assert later_standby.get(SPEND, 0.0) == 0.0  # the standby counts nothing: the pair's increase() is the spend

    # The shipped dashboard queries only names these real daemons serve (tests/ops/test_dashboard_and_rules.py).
    panels = json.loads(DASHBOARD.read_text())["panels"]
    names = queried(target["expr"] for panel in panels for target in panel.get("targets", []))
    for text in seen["texts"]:
        assert names - exported(text) == set()
