"""Orphan class ``license`` (d) with real processes: the reference controller, ``provisionerd run`` and the
simulated provider's one-shot plugin processes holding licence grants, all checked out long ago (past the grace):

- ``matlab``: 3 units, 1 in use by the licence source; the controller names no use of it (it does not say);
- ``busy``: 2 units, none in use by the source, 1 in use by the controller's count (``DemandPage.licenses``);
- ``idle``: 2 units, in use by nobody: 0 by the source and 0 by the controller;
- ``ansys``: 2 units, both in use by the source: no mismatch, no finding.

The daemon's orphan cycle asks the plugin (it declares ``licensePools``), reports ``matlab`` and ``busy`` with their
evidence (``OrphanReported`` facts in the controller's log, ``orphan_detected`` events) and never returns them, and
returns ``idle`` (its record committed first, then ``returnLicenses``). ``provisionerd orphans --dry-run --json``
(a real subprocess) shows the findings with their evidence, and changes nothing.
"""

from __future__ import annotations

import json
import time

import pytest
import sim_state
import trio
from real_world import real_world, sim
from rigs import wait

from provisionerd.domain.model import LicenseUse

pytestmark = pytest.mark.process
LONG_AGO = int(time.time()) - 7200  # past the orphan grace (1800 s): only the counts hold the return back
POOLS = [
    {"pool": "matlab", "granted": 3, "inUse": 1, "checkedOut": LONG_AGO},  # 2 units leaked
    {"pool": "busy", "granted": 2, "inUse": 0, "checkedOut": LONG_AGO},
    {"pool": "idle", "granted": 2, "inUse": 0, "checkedOut": LONG_AGO},
    {"pool": "ansys", "granted": 2, "inUse": 2, "checkedOut": LONG_AGO},  # all in use: no finding
]


def licence_passes(events: list[dict]) -> int:
    """Orphan passes that read the licence pools and had settled."""
    return sum(
        1 for e in events if e["event"] == "orphan_pass" and e.get("licenses", {}).get("read") == "ok" and e["settled"]
    )


def test_a_leaked_licence_is_reported_with_evidence_by_the_real_daemon_and_never_returned(tmp_path, sock_dir):
    seen: dict = {}

    async def main():
        provider = sim(tmp_path, sim={"licensePools": POOLS}, interval=0.5, settle=0.5)
        async with real_world(tmp_path, sock_dir, provider) as world:
            # What the controller says is in use, carried on the demand snapshot's first page.
            await world.ctl.admin.set_demand([], [LicenseUse("sim", "busy", 1), LicenseUse("sim", "idle", 0)])
            daemon = world.daemon
            proc = await daemon.start()

            def idle_returned() -> bool:
                if not licence_passes(daemon.events()):
                    return False
                return bool(sim_state.read(world.data).get("licenses", {}).get("idle", {}).get("returned"))

            await wait.until_sync("a settled licence pass and the idle grant returned", idle_returned, 90)
            passes = licence_passes(daemon.events())
            await wait.until_sync(  # none of the next passes may return another grant
                "three more orphan passes", lambda: licence_passes(daemon.events()) >= passes + 3, 60
            )
            seen["dry"] = await world.orphans("--dry-run", "--json")
            seen["rc"] = await proc.stop(20)
            seen["log"] = proc.log.read_text()
            seen["facts"] = [c.fact for c in world.facts()]
            seen["events"] = daemon.events()
            seen["state"] = sim_state.read(world.data)

    trio.run(main)
    assert seen["rc"] == 0, seen["log"][-3000:]
    # The dry-run report (after the return): each mismatch with its evidence, reported.
    dry = seen["dry"]
    assert dry.returncode == 0, dry.stderr[-2000:]
    report = json.loads(dry.stdout)
    found = {f["machine_id"]: f for f in report["findings"] if f["class"] == "license"}
    assert set(found) == {"matlab", "busy"} and {f["action"] for f in found.values()} == {"report"}
    matlab, busy = found["matlab"]["evidence"], found["busy"]["evidence"]
    assert (matlab["granted"], matlab["provider_in_use"], matlab["idle"], matlab["in_use"]) == (3, 1, 2, None)
    assert (busy["granted"], busy["provider_in_use"], busy["in_use"], busy["idle"]) == (2, 0, 1, 1)
    assert busy["in_use_source"] == "controller" and busy["returnable"] is False
    assert matlab["checked_out"] == LONG_AGO and matlab["age"] >= 7200
    assert report["mutations"] == 0
    # The daemon: it reported the two in use (facts in the controller's log), returned only the idle one.
    licence_facts = {
        f.machine_id: json.loads(f.evidence) for f in seen["facts"] if getattr(f, "orphan_class", "") == "license"
    }
    assert set(licence_facts) == {"matlab", "busy", "idle"}
    assert licence_facts["idle"]["returnable"] is True and licence_facts["idle"]["in_use"] == 0
    assert not licence_facts["busy"]["returnable"] and not licence_facts["matlab"]["returnable"]
    events = seen["events"]
    returns = [e for e in events if e["event"] == "orphan_action" and e["action"] == "return"]
    assert [(e["machine_id"], e["outcome"]) for e in returns] == [("idle", "ok")]
    assert returns[0]["confirmed_by"]["by"] == "automatic"
    # The plugin: only the idle grant was checked in, by one request.
    assert {p: s["returned"] for p, s in seen["state"]["licenses"].items()} == {
        "matlab": 0,
        "busy": 0,
        "idle": 2,
        "ansys": 0,
    }
    assert len([r for r in seen["state"]["requests"].values() if r["kind"] == "licenses"]) == 1
