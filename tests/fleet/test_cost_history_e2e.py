"""``provisionerd cost`` over the whole history, with real processes (issue 20 item 6, issue 18 item 1): the reference
controller (``refcontroller serve``), ``provisionerd run`` with the simulated provider's plugin, and the CLI.

Machines that never join are returned at their join deadline (2 s) and replaced while the demand stands, so
lifecycles end early in the run; their facts leave the resync set and the daemon's view (``--live`` sees none of
them at the end), yet ``provisionerd cost --json`` prices every one of them from the controller's log through the
history query, and its total is what the facts say: each machine's quote times its hours from launch to return.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import CommittedFact, DemandItem, InstanceFact, ResourceShape, Returned
from provisionerd.wire.messages import HistoryQuery

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = ROOT / "providers" / "simulated"


def write_config(path: Path, certs: Path, addresses: tuple[str, ...], conf: Path, data: Path, state: Path) -> None:
    path.write_text(f"""
cluster = "clu"
identity = "prov-cost"
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
[[providers]]
name = "sim"
transport = "oneshot"
path = "{SIMULATED}"
conf_dir = "{conf}"
data_dir = "{data}"
join_deadline = 2
idle_time = 1
step_limit = 50
""")


def run_cli(config: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "provisionerd", command, "--config", str(config), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    return done


def cli(config: Path, *args: str) -> dict:
    return json.loads(run_cli(config, "cost", *args).stdout)


def test_cost_prices_every_lifecycle_the_log_holds_including_those_pruned_from_the_view(tmp_path: Path) -> None:
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller_process

    certs, conf, data, config = tmp_path / "certs", tmp_path / "conf", tmp_path / "data", tmp_path / "pd.toml"
    state = Path(tempfile.mkdtemp(prefix="pd-cost-", dir="/tmp"))  # a unix socket path must be short
    init_certs(certs, "clu")
    conf.mkdir()
    data.mkdir()
    sim = json.loads((SIMULATED / "conf" / "simulated.json").read_text())
    sim["delays"] = {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}
    (conf / "simulated.json").write_text(json.dumps(sim))
    sock = state / "admin.sock"
    seen: dict = {}

    async def status() -> dict | None:
        try:
            reply = await trio.to_thread.run_sync(query, sock)
        except (OSError, ValueError):
            return None
        return reply["status"] if reply.get("ok") else None

    async def main() -> None:
        async with open_refcontroller_process(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0) as ctl:

            async def log() -> list[CommittedFact]:
                """Every fact, read as an admin through the history query (the test's own reading of the log)."""
                facts: list[CommittedFact] = []
                after = until = 0
                while True:
                    page = await ctl.admin.history(HistoryQuery((), after, until))
                    facts += page.facts
                    if page.done:
                        return facts
                    after, until = page.next_after, page.until_index

            def ended(facts: list[CommittedFact]) -> set[str]:
                return {m for c in facts if isinstance(c.fact, Returned) for m in c.fact.machine_ids}

            def made(facts: list[CommittedFact]) -> list[InstanceFact]:
                return [c.fact for c in facts if isinstance(c.fact, InstanceFact)]

            write_config(config, certs, ctl.addresses, conf, data, state)
            with open(tmp_path / "daemon.log", "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a file
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "provisionerd", "run", "--config", str(config)],
                    start_new_session=True,
                    stderr=log_file,
                    cwd=str(ROOT),
                )
            try:
                with trio.fail_after(60):
                    while not ((s := await status()) and s["leases"][0]["state"] == "held"):  # noqa: ASYNC110 - another process
                        await trio.sleep(0.1)
                await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
                with trio.fail_after(150):  # never joined: returned at the deadline and replaced, twice over
                    while len(ended(await log())) < 4:  # noqa: ASYNC110 - another process commits them
                        await trio.sleep(0.3)
                seen["live_midway"] = await trio.to_thread.run_sync(cli, config, "--live")
                seen["history_midway"] = await trio.to_thread.run_sync(cli, config)
                await ctl.set_demand([])
                with trio.fail_after(150):
                    while not (facts := await log()) or {f.machine_id for f in made(facts)} - ended(facts):  # noqa: ASYNC110
                        await trio.sleep(0.3)
                await trio.sleep(1.0)  # the daemon folds the last returns and prunes them
                seen["facts"] = await log()
                seen["history"] = await trio.to_thread.run_sync(cli, config)
                seen["history_again"] = await trio.to_thread.run_sync(cli, config)
                seen["live"] = await trio.to_thread.run_sync(cli, config, "--live")
                seen["history_all"] = await trio.to_thread.run_sync(run_cli, config, "history", "--all")
                seen["history_page"] = await trio.to_thread.run_sync(run_cli, config, "history", "--limit", "4")
                seen["controller"] = await ctl.status()
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(20):
                    seen["rc"] = await proc.wait()
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()

    trio.run(main)
    assert seen["rc"] == 0, (tmp_path / "daemon.log").read_text()[-3000:]
    facts: list[CommittedFact] = seen["facts"]
    instances = [c.fact for c in facts if isinstance(c.fact, InstanceFact)]
    returned_at = {m: c.fact.at for c in facts if isinstance(c.fact, Returned) for m in c.fact.machine_ids}
    assert len(instances) >= 4 and set(returned_at) >= {f.machine_id for f in instances}
    assert all(f.price.known and f.price.unit == "hour" and f.price.currency == "USD" for f in instances)
    expected = sum(f.price.amount * (returned_at[f.machine_id] - f.launch_time) / 3600 for f in instances)
    history = seen["history"]
    assert history["scope"] == "history" and history["history"]["until_index"] == facts[-1].index
    assert history["totals"]["USD"] == pytest.approx(expected, rel=1e-6, abs=1e-6) and expected > 0
    assert sum(line["machines"] for line in history["lines"]) == len(instances)
    assert history["not_estimated"] == {"unpriced": 0, "other_unit": 0, "no_time": 0}
    # The daemon keeps its fold: each report reads only the facts committed since the last one.
    midway = seen["history_midway"]["history"]
    assert 0 < midway["facts"] < history["history"]["facts"] == len(facts)
    assert history["history"]["read_now"] == len(facts) - midway["facts"]
    again = seen["history_again"]
    assert again["history"]["read_now"] == 0 and again["history"]["facts"] == len(facts)
    assert again["totals"] == history["totals"] and again["lines"] == history["lines"]
    # The daemon's view was pruned to live state: at the end it holds none of those machines, and midway it held
    # only the live ones, fewer than the history had by then.
    assert seen["live"]["scope"] == "live" and seen["live"]["lines"] == [] and seen["live"]["totals"] == {}
    machines = {key: sum(line["machines"] for line in seen[key]["lines"]) for key in ("live_midway", "history_midway")}
    assert machines["live_midway"] < machines["history_midway"], machines
    assert seen["controller"]["stats"].get("history_refused", 0) == 0
    # provisionerd history: the same log, every fact of the daemon's provider, ended ones included; one page of 4
    # says where the next starts.
    listed = [json.loads(line) for line in seen["history_all"].stdout.splitlines()]
    assert [(f["index"], f["kind"]) for f in listed] == [(c.index, type(c.fact).__name__) for c in facts]
    first = [json.loads(line)["index"] for line in seen["history_page"].stdout.splitlines()]
    assert first == [c.index for c in facts[:4]]
    assert f"more facts follow: --after {facts[3].index} --until {facts[-1].index}" in seen["history_page"].stderr
