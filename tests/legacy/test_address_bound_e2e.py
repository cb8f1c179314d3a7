"""Issue 19's first "Done when", with real processes: legacy machines join by the address-bound join and stay;
demand 0 returns them within one reconcile interval; no token, secret or credential in any log.

- ``refcontroller serve --address-bound-join FILE`` (a process; ``refcontroller.api.open_refcontroller_process``);
- ``provisionerd run`` (a process) serving the unmodified LSF example (``providers/examples/lsf_legacy``, run in
  legacy mode because it has no ``describeProvider.sh``) with ``LOG_INPUTS`` on (``World``, tests/legacy/conftest.py)
  and the daemon's default legacy settings: no ``[providers.legacy.user_data]``, so no token goes into its input;
- the test plays the machine image: for each machine the plugin's state file says is running, it starts
  ``provisionerd agent --address-bound --machine-id ID --token-file BOOTSTRAP`` (a process) as that machine's boot
  script would (docs/providers.md "The address-bound join").

The machines are records, so their "address" is the plugin's setting ``PRIVATE_IP = 127.0.0.1`` and every agent
connects from 127.0.0.1. What that proves: the whole path (the plugin's ``privateIpAddress`` -> the daemon's
instance fact -> the controller's address check against the worker's peer address -> admission as that instance
-> the daemon sees the machines joined and returns them as idle ones) with nothing per machine in the plugin's
input. What it cannot prove: that the address tells machines apart (both share 127.0.0.1, so either agent could
claim the other's machine); ``address_mismatch`` is tested in tests/refcontroller/test_address_bound_join.py.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import agents, procs, wait
from rigs.daemon import Daemon, daemon_config, machine_counts, machines_gone, make_certs, short_dir
from rigs.facts import stored_facts

from provisionerd.config.loader import Config, LegacyOptions
from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape, Returned
from provisionerd.domain.tokens import token_hash
from provisionerd.execution.loop_inputs import LoopSettings

pytestmark = pytest.mark.process

CLUSTER = "legacycluster"
#: ``provisionerd run``'s reconcile interval (it replans on every change, and at the latest this long after the last).
RECONCILE_INTERVAL = LoopSettings().replan_interval
JOIN_DEADLINE = 120.0
IDLE_TIME = 2.0
STAY = 6.0  # seconds both machines must stay joined (and the daemon keep them) under demand 2
#: What a join token (``domain.tokens``: ``token_urlsafe(32)``) or any other URL-safe secret can be part of.
RUN = re.compile(rb"[A-Za-z0-9_-]{16,}")


@pytest.fixture
def state() -> Iterator[Path]:
    """The daemon's state directory (events log, admin socket), with a short path."""
    with short_dir("pd-abj-") as path:
        yield path


def test_legacy_machines_join_by_address_stay_and_are_returned_within_one_reconcile_interval(
    world: Any, tmp_path: Path, state: Path
) -> None:
    from refcontroller.api import open_refcontroller_process

    certs = make_certs(tmp_path, CLUSTER)
    # The cluster's bootstrap secret: the controller's copy, and one in each machine's image.
    secret = secrets.token_urlsafe(24)
    bootstrap = agents.token_file(tmp_path, secret, "bootstrap")
    # The plugin's cloud gives its machines 127.0.0.1 (the test's machines are this host), and logs every input.
    world.settings({"BOOT_POLLS": 1, "PRIVATE_IP": "127.0.0.1"})
    # The example as a legacy provider with the default legacy settings (a journal only).
    provider = world.daemon_provider(
        max_machines=10,
        join_deadline=JOIN_DEADLINE,
        idle_time=IDLE_TIME,
        provisioning_timeout=60,
        legacy=LegacyOptions(journal=tmp_path / "lsfex.journal.json"),
    )
    seen: dict[str, Any] = {}

    async def main() -> None:
        with (tmp_path / "ctl.log").open("ab") as ctl_log:
            async with (
                open_refcontroller_process(
                    certs,
                    tmp_path / "ctl",
                    replicas=1,
                    lease_ttl=2.0,
                    check_interval=0.5,
                    heartbeat_timeout=5.0,
                    address_bound_join=bootstrap,
                    stderr=ctl_log.fileno(),
                ) as ctl,
                procs.open_procs() as started,
            ):
                config = daemon_config(certs, ctl.addresses, state, provider, cluster=CLUSTER, identity="prov-legacy")
                daemon = Daemon.write(config, tmp_path / "pd.toml", started)
                process = await daemon.start()
                machines: list[procs.Proc] = []
                try:
                    await scenario(ctl, daemon, started, machines)
                finally:
                    with trio.CancelScope(shield=True):
                        seen["daemon_rc"] = await process.stop(15.0)
                        seen["agent_rcs"] = [await agent.stop() for agent in machines]

    async def hosts(ctl: Any) -> dict[str, dict[str, Any]]:
        return {h["machine_id"]: h for h in (await ctl.status())["hosts"]}

    async def scenario(ctl: Any, daemon: Daemon, started: procs.Procs, machines: list[procs.Proc]) -> None:
        await daemon.wait_held(30)
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])
        # Both instance facts are committed (the daemon's view has them, booting): the machines may now boot.
        await daemon.wait_status(
            "two machines booting in the daemon's view", lambda s: machine_counts(s, "lsfex").get("booting") == 2, 40
        )
        running = {k: m for k, m in world.plugin_state()["machines"].items() if m["status"] == "running"}
        assert len(running) == 2 and {m["ip"] for m in running.values()} == {"127.0.0.1"}, running
        seen["machine_ids"] = sorted(running)
        for n, machine_id in enumerate(sorted(running)):
            # The machine's boot script: the image's bootstrap secret, the machine id the provider knows it by.
            home = tmp_path / f"machine-{n}"
            token = agents.token_file(home, secret, "bootstrap")
            how = ("--address-bound", "--machine-id", machine_id)
            machines.append(await agents.boot(started, home, certs, ctl.addresses[:1], token, *how))
        started_at = time.monotonic()

        async def both_joined() -> dict[str, dict[str, Any]] | None:
            table = await hosts(ctl)
            return table if set(table) == set(running) else None

        seen["hosts"] = await wait.until("both machines joined (the controller's host table)", both_joined, 30)
        seen["join_s"] = time.monotonic() - started_at
        # They stay: joined, their agents running, the daemon keeps them (nothing returning, nothing new). The
        # time is what is tested (nothing moves within it), not an order of events.
        await trio.sleep(STAY)
        seen["hosts_later"] = await hosts(ctl)
        seen["agents_alive"] = [agent.running() for agent in machines]
        seen["machines_later"] = machine_counts(await daemon.status(), "lsfex")
        seen["plugin_later"] = world.plugin_state()["machines"]

        # Demand 0: both are idle machines no demand needs, past idle_time: returned at the next reconcile pass.
        await ctl.set_demand([])
        dropped = time.monotonic()

        def asked_back() -> bool:
            machines = world.plugin_state()["machines"]
            return all(machines[m]["status"] == "terminated" for m in running)

        await wait.until_sync("the plugin asked to return both machines", asked_back, JOIN_DEADLINE)
        seen["return_called_s"] = time.monotonic() - dropped
        await daemon.wait_status(
            "both machines returned (Returned committed, out of the daemon's view)",
            machines_gone("lsfex"),
            JOIN_DEADLINE,
        )
        seen["returned_s"] = time.monotonic() - dropped
        seen["hosts_after"] = await hosts(ctl)

    trio.run(main)

    # --- the daemon ran the plugin in legacy mode, with no token in its input by default -----------------------
    config = Config.from_file(tmp_path / "pd.toml")
    assert dict(config.provider("lsfex").legacy.user_data) == {}
    assert "user_data" not in (tmp_path / "pd.toml").read_text()
    requests = [json.loads(text) for _, text in world.inputs("requestMachines")]
    assert requests and all(r["userData"] == {} for r in requests)
    assert not any({"bootstrap", "op_id", "tags"} & set(r) for r in requests)  # the legacy adapter's LSF input
    assert seen["daemon_rc"] == 0 and seen["agent_rcs"] == [0, 0]  # SIGTERM: clean exits, never a refusal (3)

    # --- both joined by the address-bound join, as the instances the plugin's machines are ---------------------
    facts = stored_facts(tmp_path / "ctl" / "facts.sqlite")
    intents = [f for f in facts if isinstance(f, RequestIntent)]
    made = {f.machine_id: f for f in facts if isinstance(f, InstanceFact)}
    assert sorted(made) == seen["machine_ids"] and {f.address for f in made.values()} == {"127.0.0.1"}
    for machine_id, host in seen["hosts"].items():
        assert host["instance_ref"] == made[machine_id].instance_ref and host["status"] in ("joined", "idle")
    assert seen["join_s"] < 30
    # ... and stayed: still joined after STAY seconds, agents running, no machine returning or replaced.
    assert set(seen["hosts_later"]) == set(made) and all(seen["agents_alive"])
    assert seen["machines_later"]["idle"] == 2 and seen["machines_later"]["returning"] == 0
    assert len(seen["plugin_later"]) == 2 and all(m["status"] == "running" for m in seen["plugin_later"].values())
    assert len(intents) == 1
    ctl_log = (tmp_path / "ctl.log").read_text()
    assert ctl_log.count("address-bound join machine_id=") == 2

    # --- demand 0: both returned within one reconcile interval, nowhere near the join deadline ------------------
    returned = {m for f in facts if isinstance(f, Returned) for m in f.machine_ids}
    assert returned == set(made)
    assert seen["returned_s"] < RECONCILE_INTERVAL < JOIN_DEADLINE, seen["returned_s"]
    assert seen["hosts_after"] == {}  # the controller dropped the returned machines' hosts

    # --- no join token, bootstrap secret or worker credential in anything the run wrote ------------------------
    hashes = {h for f in intents for h in f.token_hashes} | {f.token_hash for f in made.values()}
    assert len(hashes) == 2
    scanned = []
    files = [p for root in (tmp_path, state) for p in root.rglob("*") if p.is_file()]
    for path in sorted(files):
        if path == bootstrap or path.parent == certs or path.name.startswith("facts.sqlite"):
            continue  # the controller's secret file, the PKI, the controller's store (hashes only)
        data = path.read_bytes()
        scanned.append(path.relative_to(tmp_path if path.is_relative_to(tmp_path) else state))
        assert secret.encode() not in data, path
        assert b"cred-v1:" not in data, path
        assert not any(token_hash(run.decode()) in hashes for run in RUN.findall(data)), path
    names = {str(p) for p in scanned}
    assert {
        "data/lsfexample-provider.log",
        "ctl.log",
        "daemon-1.log",
        "events.jsonl",
        "machine-0/agent.log",
        "machine-1/agent.log",
    } <= names
    assert any(n.startswith("data/inputs/") and n.endswith("requestMachines.json") for n in names)
    assert not (tmp_path / "machine-0" / "bootstrap").exists()  # each agent deleted its copy once read
    print(
        f"joined in {seen['join_s']:.2f} s; demand 0 -> requestReturnMachines after {seen['return_called_s']:.2f} s,"
        f" returned after {seen['returned_s']:.2f} s (reconcile interval {RECONCILE_INTERVAL:g} s, join deadline"
        f" {JOIN_DEADLINE:g} s); {len(scanned)} files scanned"
    )
