"""kill -9 of ``provisionerd run`` during a legacy plugin's ``requestMachines``, then a restart (issue 19 item 1).

The plugin (the LSF example, unmodified) creates its machines and then sleeps before printing its requestId, so the
daemon dies while the call runs. The call runs on in its own session, its answer lands in its call directory under
the daemon's ``state_dir``; the restarted daemon collects it, polls the requestId as usual and tracks the machines:
no duplicate is created, and after demand 0 none is left. The reference controller runs in this process on real
mutual-TLS sockets; the daemons and plugin processes are real processes on the real clock.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import DemandItem, InstanceFact, RequestFailed, RequestIntent, ResourceShape, Returned

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "providers" / "examples" / "lsf_legacy"


def write_config(path: Path, certs: Path, addresses, conf: Path, data: Path, state: Path) -> None:
    plugin_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    path.write_text(f"""
cluster = "clu"
identity = "prov-legacy-crash"
[controller]
addresses = {json.dumps(list(addresses))}
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
state_dir = "{state}"
[[providers]]
name = "lsfex"
transport = "oneshot"
path = "{EXAMPLE}"
conf_dir = "{conf}"
data_dir = "{data}"
join_deadline = 15
idle_time = 1
[providers.env]
PATH = "{plugin_path}"
[providers.timeouts]
default = 30
[providers.legacy]
journal = "{state}/lsfex.journal.json"
""")


def test_a_daemon_killed_during_request_machines_tracks_the_machines_after_restart(tmp_path):
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller

    certs, conf, data, config_path = tmp_path / "certs", tmp_path / "conf", tmp_path / "data", tmp_path / "pd.toml"
    state = Path(tempfile.mkdtemp(prefix="pd-lgc-", dir="/tmp"))  # a unix socket path must be short
    init_certs(certs, "clu")
    conf.mkdir()
    data.mkdir()
    shutil.copy(EXAMPLE / "conf" / "lsfexampleprov_templates.json", conf)
    (conf / "lsfexampleprov_config.json").write_text(
        json.dumps({"BOOT_POLLS": 1, "SLOW_REQUEST_SECONDS": 3, "SLOW_REQUEST_PHASE": "after_create"})
    )
    sock = state / "admin.sock"
    calls = state / "calls" / "lsfex"
    seen: dict = {}

    def plugin_machines() -> dict:
        path = data / "lsfexample-state.json"
        return json.loads(path.read_text())["machines"] if path.exists() else {}

    async def start(log_name: str):
        with open(tmp_path / log_name, "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a real file
            return await trio.lowlevel.open_process(
                [sys.executable, "-m", "provisionerd", "run", "--config", str(config_path)],
                start_new_session=True,
                stderr=log_file,
                cwd=str(ROOT),
            )

    async def until(predicate, limit: float = 60.0) -> None:
        with trio.fail_after(limit):
            while not predicate():  # noqa: ASYNC110 - other processes change what is waited for
                await trio.sleep(0.05)

    async def held(limit: float = 60.0) -> None:
        with trio.fail_after(limit):
            while True:
                try:
                    reply = await trio.to_thread.run_sync(query, sock)
                except (OSError, ValueError):
                    reply = None
                if reply and reply.get("ok") and reply["status"]["leases"][0]["state"] == "held":
                    return
                await trio.sleep(0.05)

    async def main():
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl:
            store = ctl.server.cluster.store

            def facts(kind):
                return [c.fact for c in store.all_facts() if isinstance(c.fact, kind)]

            write_config(config_path, certs, ctl.addresses, conf, data, state)
            procs = []
            try:
                procs.append(await start("daemon-1.log"))
                await held()
                await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])
                await until(lambda: len(plugin_machines()) == 2)  # made; the answer comes 3 s later
                seen["call_dirs_at_kill"] = [p.name for p in calls.iterdir() if not p.name.startswith(".")]
                os.killpg(procs[0].pid, signal.SIGKILL)
                await procs[0].wait()
                seen["instances_at_kill"] = len(facts(InstanceFact))
                seen["intents_at_kill"] = [(i.op_id, i.count) for i in facts(RequestIntent)]
                # The call runs on without its daemon and leaves its answer behind.
                await until(lambda: any((p / "status").exists() for p in calls.iterdir()), 20)
                procs.append(await start("daemon-2.log"))
                await held()
                await until(lambda: len(facts(InstanceFact)) == 2)
                seen["instances"] = facts(InstanceFact)
                seen["intents"] = [(i.op_id, i.count) for i in facts(RequestIntent)]
                seen["failed"] = facts(RequestFailed)
                await ctl.set_demand([])
                # Never joined: returned at the join deadline (15 s after launch), and not replaced with demand 0.
                await until(lambda: sum(len(r.machine_ids) for r in facts(Returned)) >= 2, 60)
                await until(lambda: all(m["status"] == "terminated" for m in plugin_machines().values()), 30)
                seen["machines"] = plugin_machines()
                seen["intents_end"] = [(i.op_id, i.count) for i in facts(RequestIntent)]
                seen["calls_left"] = [p.name for p in calls.iterdir() if not p.name.startswith(".")]
                procs[1].send_signal(signal.SIGTERM)
                with trio.fail_after(20):
                    seen["rc"] = await procs[1].wait()
            finally:
                for proc in procs:
                    if proc.returncode is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        await proc.wait()

    try:
        trio.run(main)
    finally:
        log2 = (tmp_path / "daemon-2.log").read_text() if (tmp_path / "daemon-2.log").exists() else ""
        shutil.rmtree(state, ignore_errors=True)
    assert seen["rc"] == 0, log2[-3000:]
    assert len(seen["call_dirs_at_kill"]) == 1  # the requestMachines call, running
    assert seen["instances_at_kill"] == 0 and len(seen["intents_at_kill"]) == 1
    (old_op, count) = seen["intents_at_kill"][0]
    assert count == 2
    # Tracked from the collected answer: the old op's two machines, no new request, no failure.
    assert {f.op_id for f in seen["instances"]} == {old_op}
    assert seen["intents"] == seen["intents_at_kill"] and seen["failed"] == []
    assert seen["intents_end"] == seen["intents_at_kill"]
    # No duplicate was ever made, and none is left.
    assert len(seen["machines"]) == 2, seen["machines"]
    assert all(m["status"] == "terminated" for m in seen["machines"].values())
    assert seen["calls_left"] == []  # collected call directories are removed
    assert "tracked from the collected output" in log2
