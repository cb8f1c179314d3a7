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
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    LegacyOptions,
    ProviderConfig,
    ProviderTimeouts,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape, Returned
from provisionerd.domain.tokens import token_hash
from provisionerd.execution.loop_inputs import LoopSettings

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "providers" / "examples" / "lsf_legacy"
CLUSTER = "legacycluster"
#: ``provisionerd run``'s reconcile interval (it replans on every change, and at the latest this long after the last).
RECONCILE_INTERVAL = LoopSettings().replan_interval
JOIN_DEADLINE = 120.0
IDLE_TIME = 2.0
STAY = 6.0  # seconds both machines must stay joined (and the daemon keep them) under demand 2
#: What a join token (``domain.tokens``: ``token_urlsafe(32)``) or any other URL-safe secret can be part of.
RUN = re.compile(rb"[A-Za-z0-9_-]{16,}")


def daemon_config(world: Any, tmp: Path, state: Path, certs: Path, addresses: tuple[str, ...]) -> Path:
    """The daemon's config: the example as a legacy provider with the default legacy settings (a journal only)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    config = Config(
        cluster=CLUSTER,
        identity="prov-legacy",
        controller=ControllerSettings(
            addresses,
            connect_timeout=3,
            request_timeout=5,
            heartbeat_interval=0.5,
            heartbeat_timeout=5,
            backoff=Backoff(initial=0.1, max=1),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
        providers=(
            ProviderConfig(
                "lsfex",
                "oneshot",
                path=EXAMPLE,
                conf_dir=world.conf,
                data_dir=world.data,
                max_machines=10,
                join_deadline=JOIN_DEADLINE,
                idle_time=IDLE_TIME,
                provisioning_timeout=60,
                env={"PATH": path},
                timeouts=ProviderTimeouts(default=20),
                legacy=LegacyOptions(journal=tmp / "lsfex.journal.json"),
            ),
        ),
    )
    write_daemon_config(config, tmp / "pd.toml")
    return tmp / "pd.toml"


async def daemon_status(sock: Path) -> dict[str, Any] | None:
    try:
        reply = await trio.to_thread.run_sync(query, sock)
    except (OSError, ValueError):
        return None
    return reply["status"] if reply.get("ok") else None


async def wait_for(what: str, probe: Any, limit: float) -> Any:
    """Poll the async ``probe`` until it returns something truthy (real clock); fail naming ``what``."""
    with trio.move_on_after(limit):
        while True:
            found = await probe()
            if found:
                return found
            await trio.sleep(0.1)
    raise AssertionError(f"not within {limit:g} s: {what}")


def machines_of(status: dict[str, Any] | None) -> dict[str, int]:
    return {} if status is None else status["providers"]["lsfex"]["machines"]


async def start_agent(certs: Path, controller: str, machine_id: str, home: Path) -> trio.Process:
    """The machine's boot script: the image's bootstrap secret (a 0600 file the agent deletes once read), the
    machine id the provider knows it by, the address-bound join."""
    with (home / "agent.log").open("ab") as log:  # noqa: ASYNC230 - the child's output needs a real file
        return await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "provisionerd",
                "agent",
                "--certs",
                str(certs),
                "--controllers",
                controller,
                "--address-bound",
                "--machine-id",
                machine_id,
                "--token-file",
                str(home / "bootstrap"),
                "--heartbeat",
                "0.5",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


async def stop(process: trio.Process, grace: float = 10.0) -> int:
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        with trio.move_on_after(grace):
            await process.wait()
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
    return process.returncode


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path, for the daemon's admin socket (a unix socket path must be short)."""
    path = Path(tempfile.mkdtemp(prefix="pd-abj-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_legacy_machines_join_by_address_stay_and_are_returned_within_one_reconcile_interval(
    world: Any, tmp_path: Path, short_dir: Path
) -> None:
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller_process
    from refcontroller.store import FactStore

    certs = tmp_path / "certs"
    init_certs(certs, CLUSTER)
    # The cluster's bootstrap secret: the controller's copy, and one in each machine's image.
    secret = secrets.token_urlsafe(24)
    bootstrap = tmp_path / "bootstrap"
    bootstrap.write_text(secret)
    bootstrap.chmod(0o600)
    # The plugin's cloud gives its machines 127.0.0.1 (the test's machines are this host), and logs every input.
    world.settings({"BOOT_POLLS": 1, "PRIVATE_IP": "127.0.0.1"})
    state = short_dir
    seen: dict[str, Any] = {}

    async def main() -> None:
        with (tmp_path / "ctl.log").open("ab") as ctl_log:
            async with open_refcontroller_process(
                certs,
                tmp_path / "ctl",
                replicas=1,
                lease_ttl=2.0,
                check_interval=0.5,
                heartbeat_timeout=5.0,
                address_bound_join=bootstrap,
                stderr=ctl_log.fileno(),
            ) as ctl:
                config = daemon_config(world, tmp_path, state, certs, ctl.addresses)
                with (tmp_path / "daemon.log").open("ab") as daemon_log:
                    daemon = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "provisionerd", "run", "--config", str(config)],
                        start_new_session=True,
                        stderr=daemon_log,
                        cwd=str(REPO),
                    )
                agents: list[trio.Process] = []
                try:
                    await scenario(ctl, daemon, agents)
                finally:
                    with trio.CancelScope(shield=True):
                        seen["daemon_rc"] = await stop(daemon, 15.0)
                        seen["agent_rcs"] = [await stop(agent) for agent in agents]

    async def hosts(ctl: Any) -> dict[str, dict[str, Any]]:
        return {h["machine_id"]: h for h in (await ctl.status())["hosts"]}

    async def scenario(ctl: Any, daemon: trio.Process, agents: list[trio.Process]) -> None:
        sock = state / "admin.sock"

        async def lease_held() -> bool:
            status = await daemon_status(sock)
            return status is not None and status["leases"][0]["state"] == "held"

        await wait_for("the daemon holds the lease", lease_held, 30)
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])

        async def booting() -> bool:
            return machines_of(await daemon_status(sock)).get("booting") == 2

        # Both instance facts are committed (the daemon's view has them, booting): the machines may now boot.
        await wait_for("two machines booting in the daemon's view", booting, 40)
        running = {k: m for k, m in world.plugin_state()["machines"].items() if m["status"] == "running"}
        assert len(running) == 2 and {m["ip"] for m in running.values()} == {"127.0.0.1"}, running
        seen["machine_ids"] = sorted(running)
        for n, machine_id in enumerate(sorted(running)):
            home = tmp_path / f"machine-{n}"
            home.mkdir()
            (home / "bootstrap").write_text(secret)
            (home / "bootstrap").chmod(0o600)
            agents.append(await start_agent(certs, ctl.addresses[0], machine_id, home))
        started = time.monotonic()

        async def both_joined() -> dict[str, dict[str, Any]] | None:
            table = await hosts(ctl)
            return table if set(table) == set(running) else None

        seen["hosts"] = await wait_for("both machines joined (the controller's host table)", both_joined, 30)
        seen["join_s"] = time.monotonic() - started
        # They stay: joined, their agents running, the daemon keeps them (nothing returning, nothing new).
        await trio.sleep(STAY)
        seen["hosts_later"] = await hosts(ctl)
        seen["agents_alive"] = [agent.returncode is None for agent in agents]
        seen["machines_later"] = machines_of(await daemon_status(sock))
        seen["plugin_later"] = world.plugin_state()["machines"]

        # Demand 0: both are idle machines no demand needs, past idle_time: returned at the next reconcile pass.
        await ctl.set_demand([])
        dropped = time.monotonic()

        async def asked_back() -> bool:
            machines = world.plugin_state()["machines"]
            return all(machines[m]["status"] == "terminated" for m in running)

        async def gone() -> bool:
            counts = machines_of(await daemon_status(sock))
            return bool(counts) and not any(counts.values())

        await wait_for("the plugin asked to return both machines", asked_back, JOIN_DEADLINE)
        seen["return_called_s"] = time.monotonic() - dropped
        await wait_for("both machines returned (Returned committed, out of the daemon's view)", gone, JOIN_DEADLINE)
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
    store = FactStore.open(tmp_path / "ctl" / "facts.sqlite")
    try:
        facts = [c.fact for c in store.all_facts()]
    finally:
        store.close()
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
        "daemon.log",
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
