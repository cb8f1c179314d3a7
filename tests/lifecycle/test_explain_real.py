"""``provisionerd explain`` and ``provisionerd plan --what-if`` against a real daemon on the simulated provider
(issue 32, items 2 and 3).

The provider offers CPU templates only and has ``max_machines = 10``. A what-if first: with only a GPU item live,
the hypothetical demand of 3 CPU machines lists the request the daemon would make, and nothing follows it (no
fact, no machine at the provider, no action event). Then the live demand asks for 15 CPU machines and one GPU
machine: ``explain`` names ``max_machines 10/10`` for the first item and "no template offers gpus >= 1" for the
second, two different reasons, and the events carry the same ones. The reference controller runs in this process
on real mutual-TLS sockets; the daemon and the plugin's processes are real.
"""

from __future__ import annotations

import json

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir, simulated_machines, simulated_provider
from rigs.facts import facts_of

from provisionerd.domain.model import DemandItem, InstanceFact, ResourceShape

pytestmark = pytest.mark.process

CPU_ONLY = [
    {
        "templateId": "sim-cpu-8",
        "maxNumber": 200,
        "capacity": 200,
        "attributes": {"type": ["String", "X86_64"], "ncpus": ["Numeric", "8"], "mem": ["Numeric", "32768"]},
        "price": {"amount": 0.34, "currency": "USD", "unit": "hour"},
    }
]
GPU = DemandItem("gpu", ResourceShape(ncpus=8, gpus=1), 1)
CPU = DemandItem("cpu", ResourceShape(ncpus=8), 15)
WHAT_IF = [
    {"demand_id": "cpu", "shape": {"ncpus": 8}, "count": 3},
    {"demand_id": "gpu", "shape": {"ncpus": 8, "gpus": 1}, "count": 1},
]


def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_explain_names_the_cap_and_the_missing_gpu_and_what_if_changes_nothing(tmp_path):
    from refcontroller.api import open_refcontroller

    seen: dict = {}
    what_if = tmp_path / "what-if.json"
    what_if.write_text(json.dumps(WHAT_IF))

    async def main():
        certs = make_certs(tmp_path, "clu")
        sim = simulated_provider(
            tmp_path,
            sim={"delays": {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}, "templates": CPU_ONLY},
            max_machines=10,
        )
        with short_dir("pd-explain-") as state:
            async with (
                open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl,
                procs.open_procs() as started,
            ):
                config = daemon_config(certs, ctl.addresses, state, sim, cluster="clu", identity="prov-explain")
                daemon = Daemon.write(config, tmp_path / "pd.toml", started)
                proc = await daemon.start()
                await daemon.wait_held(60)
                await ctl.set_demand([GPU])

                async def explained(*args: str):
                    argv = procs.provisionerd("explain", "--socket", daemon.sock, *args)
                    result = await procs.run_async(argv)
                    return result if result.returncode == 0 else None

                first = await wait.until("explain answers", lambda: explained("--json"), 60)
                seen["gpu_only"] = json.loads(first.stdout)
                store = ctl.server.cluster.store
                before = len(list(store.all_facts()))
                actions_before = sum(1 for e in _events(daemon.events_path) if e.get("event") == "action")
                seen["what_if"] = await procs.run_async(
                    procs.provisionerd("plan", "--what-if", what_if, "--socket", daemon.sock, "--json")
                )
                seen["what_if_text"] = await procs.run_async(
                    procs.provisionerd("plan", "--what-if", what_if, "--config", daemon.path)
                )
                await trio.sleep(2.0)  # an absence: time for a dispatch that must not come
                after = len(list(store.all_facts()))
                seen["unchanged"] = (before, after)
                seen["sim_machines"] = simulated_machines(sim)
                seen["actions"] = (
                    actions_before,
                    sum(1 for e in _events(daemon.events_path) if e.get("event") == "action"),
                )
                await ctl.set_demand([CPU, GPU])
                await wait.until_sync("10 instance facts", lambda: len(facts_of(store, InstanceFact)) >= 10, 60)

                async def capped():
                    result = await explained("--json")
                    if result is None:
                        return None
                    document = json.loads(result.stdout)
                    items = {i["demand_id"]: i for i in document["items"]}
                    return document if "max_machines 10/10" in items["cpu"]["summary"] else None

                seen["explain"] = await wait.until("explain names the cap", capped, 30)
                seen["text"] = await explained()
                seen["one"] = await explained("gpu", "--json")
                seen["unknown"] = await procs.run_async(
                    procs.provisionerd("explain", "--socket", daemon.sock, "nosuch")
                )
                bad = tmp_path / "bad.json"
                bad.write_text(json.dumps([{"demand_id": "x", "shape": {"ncpus": "8"}, "count": 1}]))
                seen["bad"] = await procs.run_async(
                    procs.provisionerd("plan", "--what-if", bad, "--socket", daemon.sock)
                )
                seen["events"] = _events(daemon.events_path)
                seen["rc"] = await proc.stop(20)

    trio.run(main)
    assert seen["rc"] == 0
    gpu_only = {i["demand_id"]: i for i in seen["gpu_only"]["items"]}
    assert gpu_only["gpu"]["summary"] == "no template offers gpus >= 1"
    # What-if: the request it would make, and nothing done.
    assert seen["what_if"].returncode == 0, seen["what_if"].stderr
    document = json.loads(seen["what_if"].stdout)
    assert document["what_if"] is True
    assert any(a.startswith("request 3 x sim/sim-cpu-8 for cpu") for a in document["actions"])
    assert "WHAT-IF" in seen["what_if_text"].stdout and "request 3 x sim/sim-cpu-8" in seen["what_if_text"].stdout
    before, after = seen["unchanged"]
    assert before == after
    assert seen["sim_machines"] == {}
    assert seen["actions"][0] == seen["actions"][1]
    # Explain: two items, two different reasons, with their figures.
    items = {i["demand_id"]: i for i in seen["explain"]["items"]}
    cpu, gpu = items["cpu"], items["gpu"]
    assert (cpu["wanted"], cpu["supplied"] + cpu["outstanding"], cpu["unmet"]) == (15, 10, 5)
    # Blocked by the cap, or not tried while the step window (10 per 60 s) is full, then the cap: named either way.
    (offer,) = cpu["offers"]
    assert offer["verdict"] in ("blocked", "untried")
    assert offer["reasons"][-1] in (
        "max_machines 10/10 (provider cap reached)",
        "then max_machines 10/10 (provider cap reached)",
    )
    assert gpu["summary"] == "no template offers gpus >= 1"
    assert [(o["verdict"], o["reasons"]) for o in gpu["offers"]] == [("incompatible", ["ngpus 0 < 1 required"])]
    text = seen["text"].stdout
    assert "max_machines 10/10" in text and "no template offers gpus >= 1" in text
    assert [i["demand_id"] for i in json.loads(seen["one"].stdout)["items"]] == ["gpu"]
    assert seen["unknown"].returncode == 1 and "no demand item 'nosuch'" in seen["unknown"].stderr
    assert seen["bad"].returncode == 1 and "$[0].shape.ncpus" in seen["bad"].stderr
    assert "Traceback" not in seen["bad"].stderr + seen["unknown"].stderr
    # The events carry the same reasons: never "no eligible offer with room" alone.
    unmet = [e for e in seen["events"] if e.get("event") == "plan_note" and e.get("kind") == "unmet_demand"]
    assert any("max_machines 10/10" in e["detail"] for e in unmet if e["demand_id"] == "cpu")
    assert all("ngpus 0 < 1 required" in e["detail"] for e in unmet if e["demand_id"] == "gpu")
