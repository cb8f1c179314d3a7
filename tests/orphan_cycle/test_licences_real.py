"""Orphan class ``license`` (d) with real processes: the reference controller, ``provisionerd run`` and the
simulated provider's one-shot plugin processes holding a leaked licence grant (3 units checked out, 1 in use by the
licence source's count) and a fully used one.

The daemon's orphan cycle asks the plugin (it declares ``licensePools``), reports the leaked grant with its
evidence (an ``OrphanReported`` fact in the controller's log, an ``orphan_detected`` event), and never returns it:
the controller does not say how many units are in use, which is never read as 0. ``provisionerd orphans --dry-run
--json`` (a real subprocess) shows the same finding with its evidence, and changes nothing.
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

pytestmark = pytest.mark.slow
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
        {"pool": "ansys", "granted": 2, "inUse": 2, "checkedOut": LONG_AGO},  # all in use: no finding
    ]
    (conf / "simulated.json").write_text(json.dumps(shipped))
    seen: dict = {}

    async def main():
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=5.0, check_interval=0.5) as ctl:
            cluster = ctl.server.cluster
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
                    ) or not [c for c in cluster.store.all_facts() if getattr(c.fact, "orphan_class", "") == "license"]:
                        await trio.sleep(0.2)
                await trio.sleep(2.0)  # a few more passes: none of them may return the grant
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
    # The dry-run report: the mismatch, with its evidence, reported (the controller's count is unknown).
    dry = seen["dry"]
    assert dry.returncode == 0, dry.stderr.decode()[-2000:]
    report = json.loads(dry.stdout)
    [finding] = [f for f in report["findings"] if f["class"] == "license"]
    assert (finding["machine_id"], finding["action"]) == ("matlab", "report")
    evidence = finding["evidence"]
    assert (evidence["granted"], evidence["provider_in_use"], evidence["idle"]) == (3, 1, 2)
    assert evidence["in_use"] is None and evidence["returnable"] is False and evidence["checked_out"] == LONG_AGO
    assert report["mutations"] == 0
    # The daemon: it reported the grant (a fact in the controller's log) and audited it, and returned nothing.
    [reported] = [f for f in seen["facts"] if getattr(f, "orphan_class", "") == "license"]
    assert reported.machine_id == "matlab" and json.loads(reported.evidence)["idle"] == 2
    events = events_of(state)
    detected = [e for e in events if e["event"] == "orphan_detected" and e["orphan_class"] == "license"]
    assert {e["machine_id"] for e in detected} == {"matlab"} and {e["action"] for e in detected} == {"report"}
    assert not [e for e in events if e["event"] == "orphan_action" and e["action"] == "return"]
    # The plugin: nothing checked in, and no returnLicenses request was ever made.
    assert {p: s["returned"] for p, s in seen["state"]["licenses"].items()} == {"matlab": 0, "ansys": 0}
    assert not [r for r in seen["state"]["requests"].values() if r["kind"] == "licenses"]
