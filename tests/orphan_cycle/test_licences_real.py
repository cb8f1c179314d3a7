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
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import sim_state
import trio

from provisionerd.domain.model import LicenseUse

pytestmark = pytest.mark.process
ROOT = Path(__file__).resolve().parents[2]
LONG_AGO = int(time.time()) - 7200  # past the orphan grace (1800 s): only the counts hold the return back


def write_config(path: Path, certs: Path, addresses, data: Path, conf: Path, state: Path) -> None:
    path.write_text(f"""
cluster = "clu"
identity = "prov-main"
[controller]
addresses = {json.dumps(list(addresses))}
heartbeat_interval = 0.5
heartbeat_timeout = 5
request_timeout = 5
connect_timeout = 5
backoff = {{initial = 0.1, max = 1, multiplier = 2, jitter = 0.5}}
[tls]
ca = "{certs}/ca.pem"
cert = "{certs}/provisioner.pem"
key = "{certs}/provisioner.key"
[lease]
margin = 0.5
[daemon]
events_log = "{state}/events.jsonl"
[[providers]]
name = "sim"
transport = "oneshot"
path = "{ROOT}/providers/simulated"
conf_dir = "{conf}"
data_dir = "{data}"
[providers.orphans]
interval = 0.5
settle = 0.5
""")


def events_of(state: Path) -> list[dict]:
    try:
        text = (state / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_leaked_licence_is_reported_with_evidence_by_the_real_daemon_and_never_returned(tmp_path):
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller

    certs, data, conf, state = tmp_path / "certs", tmp_path / "simdata", tmp_path / "conf", tmp_path / "state"
    config_path = tmp_path / "pd.toml"
    init_certs(certs, "clu")
    conf.mkdir()
    state.mkdir(mode=0o700)
    shipped = json.loads((ROOT / "providers" / "simulated" / "conf" / "simulated.json").read_text())
    shipped["licensePools"] = [
        {"pool": "matlab", "granted": 3, "inUse": 1, "checkedOut": LONG_AGO},  # 2 units leaked
        {"pool": "busy", "granted": 2, "inUse": 0, "checkedOut": LONG_AGO},
        {"pool": "idle", "granted": 2, "inUse": 0, "checkedOut": LONG_AGO},
        {"pool": "ansys", "granted": 2, "inUse": 2, "checkedOut": LONG_AGO},  # all in use: no finding
    ]
    (conf / "simulated.json").write_text(json.dumps(shipped))
    seen: dict = {}

    async def main():
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=5.0, check_interval=0.5) as ctl:
            cluster = ctl.server.cluster
            # What the controller says is in use, carried on the demand snapshot's first page.
            await ctl.admin.set_demand([], [LicenseUse("sim", "busy", 1), LicenseUse("sim", "idle", 0)])
            write_config(config_path, certs, ctl.addresses, data, conf, state)
            with open(tmp_path / "daemon.log", "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a real file
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "provisionerd", "run", "--config", str(config_path)],
                    start_new_session=True,
                    stderr=log_file,
                    cwd=str(ROOT),
                )
            try:
                with trio.fail_after(90):
                    # A poll on purpose: the daemon's events log is a file with no event to wait on.
                    while not any(  # noqa: ASYNC110
                        e["event"] == "orphan_pass" and e.get("licenses", {}).get("read") == "ok" and e["settled"]
                        for e in events_of(state)
                    ) or not sim_state.read(data).get("licenses", {}).get("idle", {}).get("returned"):
                        await trio.sleep(0.2)
                await trio.sleep(2.0)  # a few more passes: none of them may return another grant
                seen["dry"] = await trio.run_process(
                    [
                        sys.executable,
                        "-m",
                        "provisionerd",
                        "orphans",
                        "--config",
                        str(config_path),
                        "--dry-run",
                        "--json",
                    ],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    cwd=str(ROOT),
                )
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(20):
                    seen["rc"] = await proc.wait()
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
            seen["facts"] = [c.fact for c in cluster.store.all_facts()]
        seen["state"] = sim_state.read(data)

    trio.run(main)
    log = (tmp_path / "daemon.log").read_text()
    assert seen["rc"] == 0, log[-3000:]
    # The dry-run report (after the return): each mismatch with its evidence, reported.
    dry = seen["dry"]
    assert dry.returncode == 0, dry.stderr.decode()[-2000:]
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
    events = events_of(state)
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
