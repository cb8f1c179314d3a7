"""``provisionerd machines`` against a real daemon on the simulated provider (issue 32, item 1).

Three machines for one demand item: one joins idle, one joins busy, one never joins. The demand then drops to two,
so the idle one is the item's surplus. ``provisionerd machines --json`` lists the three with their provider,
template, demand item, state, joined or not, busy or idle, age, idle since and op, and the next planned action:
the idle one returned at ``idle since + idle_time``, the one not joined at ``launch + join_deadline``, the busy one
kept. The reference controller runs in this process on real mutual-TLS sockets; the daemon and the plugin's
processes are real.
"""

from __future__ import annotations

import json
import time

import pytest
import trio
from rigs import procs, wait
from rigs.simulated_run import simulated_run

from provisionerd.daemon.admin_socket import request
from provisionerd.domain.model import DemandItem, HostState, HostStatus, InstanceFact, ResourceShape

pytestmark = pytest.mark.process

IDLE_TIME, JOIN_DEADLINE = 300.0, 900.0  # the defaults (planner.policy.ProviderPolicy)


def test_machines_lists_every_machine_with_its_next_action_and_time(tmp_path):
    seen: dict = {}

    async def main():
        async with simulated_run(tmp_path, "mach", identity="prov-machines") as run:
            proc = await run.daemon.start()
            await run.daemon.wait_held(60)
            await run.ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
            facts = await wait.until_sync(
                "3 instance facts", lambda: (f := run.facts(InstanceFact)) and len(f) >= 3 and f, 60
            )
            idle, busy, booting = sorted(facts, key=lambda f: f.machine_id)
            since = time.time() - 30.0
            for fact, status in ((idle, HostStatus.IDLE), (busy, HostStatus.BUSY)):
                host = HostState(fact.instance_ref, "sim", fact.machine_id, status, since, f"node-{fact.machine_id}")
                run.ctl.server.cluster.hosts.add(host)
                run.ctl.server.broadcast_host(host)
            await run.ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])

            def surplus_shown(result) -> bool:
                lines = [json.loads(line) for line in result.stdout.splitlines()]
                return result.returncode == 0 and any(line["next_reason"] == "idle" for line in lines)

            async def listed():
                result = await procs.run_async(procs.provisionerd("machines", "--config", run.daemon.path, "--json"))
                return result if surplus_shown(result) else None

            seen["json"] = await wait.until("the idle machine shown as surplus", listed, 30)
            seen["text"] = await procs.run_async(procs.provisionerd("machines", "--config", run.daemon.path))
            seen["busy"] = await procs.run_async(
                procs.provisionerd("machines", "--socket", run.daemon.sock, "--state", "busy", "--json")
            )
            seen["other"] = await procs.run_async(
                procs.provisionerd("machines", "--socket", run.daemon.sock, "--provider", "nope", "--json")
            )
            seen["bad_state"] = await procs.run_async(
                procs.provisionerd("machines", "--socket", run.daemon.sock, "--state", "sleeping")
            )
            seen["bad_cursor"] = request(run.daemon.sock, {"cmd": "machines", "cursor": "nope.12"})
            seen["paged"] = await procs.run_async(
                procs.provisionerd("machines", "--socket", run.daemon.sock, "--limit", "1", "--json")
            )
            seen["facts"] = {f.machine_id: f for f in facts}
            seen["ids"] = (idle.machine_id, busy.machine_id, booting.machine_id)
            seen["since"] = since
            seen["rc"] = await proc.stop(20)

    trio.run(main)
    assert seen["rc"] == 0
    idle, busy, booting = seen["ids"]
    lines = {line["machine_id"]: line for line in map(json.loads, seen["json"].stdout.splitlines())}
    assert set(lines) == {idle, busy, booting}
    for machine_id, line in lines.items():
        fact = seen["facts"][machine_id]
        assert (line["provider"], line["template"], line["demand_id"], line["op_id"]) == (
            "sim",
            fact.template_id,
            "d1",
            fact.op_id,
        )
        assert line["age_s"] is not None and line["age_s"] >= 0
    assert (lines[idle]["state"], lines[idle]["joined"], lines[idle]["activity"]) == ("idle", True, "idle")
    assert abs(lines[idle]["idle_since"] - seen["since"]) < 1e-3
    assert (lines[idle]["next_action"], lines[idle]["next_reason"]) == ("return", "idle")
    assert abs(lines[idle]["next_at"] - (seen["since"] + IDLE_TIME)) <= 1.0
    assert lines[idle]["next_rule"] == "idle_time 300 s"
    assert (lines[busy]["state"], lines[busy]["activity"], lines[busy]["next_action"]) == ("busy", "busy", "kept")
    assert lines[busy]["next_at"] is None
    launched = seen["facts"][booting].launch_time
    assert (lines[booting]["state"], lines[booting]["joined"]) == ("booting", False)
    assert (lines[booting]["next_action"], lines[booting]["next_reason"]) == ("return", "never_joined")
    assert abs(lines[booting]["next_at"] - (launched + JOIN_DEADLINE)) <= 1.0
    # The table: a header and one line per machine, the next action in words.
    text = seen["text"].stdout.splitlines()
    assert seen["text"].returncode == 0 and text[0].startswith("MACHINE") and len(text) == 4
    assert any(idle in row and "return at" in row and "idle_time 300 s" in row for row in text)
    # Filters, paging, and bad input: a clear message and exit code, no traceback.
    assert [json.loads(x)["machine_id"] for x in seen["busy"].stdout.splitlines()] == [busy]
    assert seen["other"].returncode == 0 and seen["other"].stdout == ""
    assert seen["bad_state"].returncode == 2 and "invalid choice" in seen["bad_state"].stderr
    assert "Traceback" not in seen["bad_state"].stderr
    assert seen["bad_cursor"]["ok"] is False and "cursor" in seen["bad_cursor"]["error"]
    assert sorted(json.loads(x)["machine_id"] for x in seen["paged"].stdout.splitlines()) == sorted(seen["ids"])
