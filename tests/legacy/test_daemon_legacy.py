"""The unmodified LSF example under the real daemon, end to end on the real clock.

The reference controller runs in this process over real mutual-TLS sockets; ``DaemonCore`` runs in this process
with the clients the config gives it (``provider_clients``: the legacy adapter, detected, with the configured
``[providers.legacy]`` journal and userData template). The example plugin boots nothing, so the test plays the
machines with the userData recipe of docs/providers.md: each machine's userData (the file the example keeps as a
cloud would hand it to the instance) carries its join token, instance ref and controllers, and a real
``WorkerAgent`` joins with them.

demand up -> requestMachines (one plugin call per machine: the template names {join_token}) -> status -> instance
facts whose token hashes are the booted tokens' -> workers join -> demand down -> returns confirmed -> demand up ->
the cloud reclaims the machine (the example's RECLAIM_COUNT) -> ``Lost``. Then the dry-run report on the same
config: the legacy provider's invisible classes are stated, the listing is not "unreadable", exit 0.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.cli.agent import tls_connector as worker_connector
from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    LegacyOptions,
    OrphanSettings,
    ProviderConfig,
    ProviderTimeouts,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.metered import unwrap
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import DemandItem, InstanceFact, Lost, RequestIntent, ResourceShape, Returned
from provisionerd.domain.tokens import token_hash
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from provisionerd.provider.legacy.adapter import LegacyProvider

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "providers" / "examples" / "lsf_legacy"
CLUSTER = "testcluster"


def write_config(tmp: Path, certs: Path, addresses: tuple[str, ...]) -> Path:
    conf, data = tmp / "lsf-conf", tmp / "lsf-data"
    conf.mkdir()
    data.mkdir()
    shutil.copy(EXAMPLE / "conf" / "lsfexampleprov_templates.json", conf)
    plugin_settings(tmp, {})
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    user_data = {
        "PROVISIONERD_JOIN_TOKEN": "{join_token}",
        "PROVISIONERD_CONTROLLERS": "{controllers}",
        "PROVISIONERD_INSTANCE": "{instance_ref}",
    }
    config = Config(
        cluster=CLUSTER,
        identity="prov-legacy",
        controller=ControllerSettings(
            addresses,
            connect_timeout=5,
            request_timeout=5,
            heartbeat_interval=0.5,
            heartbeat_timeout=5,
            backoff=Backoff(initial=0.05, max=0.5),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=tmp / "events.jsonl"),
        providers=(
            ProviderConfig(
                "lsfex",
                "oneshot",
                path=EXAMPLE,
                conf_dir=conf,
                data_dir=data,
                max_machines=10,
                provisioning_timeout=60,
                env={"PATH": path},
                timeouts=ProviderTimeouts(default=20),
                orphans=OrphanSettings(interval=0.5, settle=0),
                legacy=LegacyOptions(journal=tmp / "lsfex.journal.json", user_data=user_data),
            ),
        ),
    )
    write_daemon_config(config, tmp / "pd.toml")
    return tmp / "pd.toml"


def plugin_settings(tmp: Path, values: dict[str, Any]) -> None:
    """The example's own settings file (it reads it on every call)."""
    (tmp / "lsf-conf" / "lsfexampleprov_config.json").write_text(json.dumps({"BOOT_POLLS": 1, **values}))


def user_data(tmp: Path, machine_id: str) -> dict[str, str]:
    """What the cloud hands the machine at boot (the example keeps it per machine)."""
    return json.loads((tmp / "lsf-data" / "userdata" / machine_id).read_text())


def plugin_machines(tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "lsf-data" / "lsfexample-state.json").read_text())["machines"]


def facts_of(ctl: Any, kind: type) -> list[Any]:
    return [c.fact for c in ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]


async def wait_until(predicate: Any, limit: float = 40.0) -> None:
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - waits on any predicate over the system under test, which has no event for it
            await trio.sleep(0.05)


def test_an_lsf_plugin_runs_the_whole_lifecycle_under_the_daemon(tmp_path):
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller

    certs = tmp_path / "certs"
    init_certs(certs, CLUSTER)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5) as ctl:
            config = Config.from_file(write_config(tmp_path, certs, ctl.addresses))
            policy = Policy(
                cluster=CLUSTER,
                idle_time=1.0,
                join_deadline=120.0,
                provisioning_timeout=config.provider("lsfex").provisioning_timeout,
            )
            core = DaemonCore(
                config,
                policy=policy,
                offer_interval=5.0,
                loop_settings=LoopSettings(replan_interval=0.5, reclaim_interval=0.5, recover_after=10.0),
                executor_settings=ExecutorSettings(
                    cluster=CLUSTER,
                    controllers=ctl.addresses,
                    poll_initial=0.05,
                    poll_max=0.5,
                    retry_delay=0.1,
                    provisioning_timeout=60.0,
                ),
            )
            seen["client"] = core.providers["lsfex"]
            async with trio.open_nursery() as nursery:
                await nursery.start(core.run)
                try:
                    await scenario(ctl, core, nursery)
                finally:
                    with trio.CancelScope(shield=True):
                        await core.release_leases()
                    nursery.cancel_scope.cancel()
            core.events.close()
            # The admin's dry run against the same config (its own process, its own adapter over the journal).
            seen["dry_run"] = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "provisionerd",
                    "orphans",
                    "--config",
                    str(tmp_path / "pd.toml"),
                    "--dry-run",
                    "--json",
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=str(REPO),
            )
            seen["table"] = await trio.run_process(
                [sys.executable, "-m", "provisionerd", "orphans", "--config", str(tmp_path / "pd.toml"), "--dry-run"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=str(REPO),
            )

    async def scenario(ctl: Any, core: DaemonCore, nursery: trio.Nursery) -> None:
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 2)
        # The machines boot: each reads its userData and starts the worker agent (docs/providers.md's recipe).
        connect = worker_connector(certs)
        booted = {}
        for fact in facts_of(ctl, InstanceFact):
            data = user_data(tmp_path, fact.machine_id)
            booted[fact.machine_id] = data
            agent = WorkerAgent(
                AgentConfig(
                    controllers=data["PROVISIONERD_CONTROLLERS"].split(","),
                    instance_ref=data["PROVISIONERD_INSTANCE"],
                    heartbeat_interval=0.5,
                    reply_timeout=5.0,
                ),
                data["PROVISIONERD_JOIN_TOKEN"],
                connect,
            )
            nursery.start_soon(agent.run)
        await wait_until(lambda: len(ctl.server.cluster.hosts.all()) == 2)
        seen["hosts"] = ctl.server.cluster.hosts.all()
        seen["booted"] = booted
        await ctl.set_demand([])
        await wait_until(lambda: sum(len(f.machine_ids) for f in facts_of(ctl, Returned)) == 2)
        seen["after_return"] = plugin_machines(tmp_path)
        # Demand again; the cloud then takes the new machine back.
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 1)])
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 3)
        plugin_settings(tmp_path, {"RECLAIM_COUNT": 1})
        await wait_until(lambda: facts_of(ctl, Lost))
        # Demand still wants one machine: the planner replaces the lost one (let it finish before shutting down,
        # or the cancelled call would rightly be reported as an unknown outcome).
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 4)
        seen["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        seen["orphan_passes"] = [e for e in core.events.recent if e["event"] == "orphan_pass"]

    trio.run(main)
    facts = seen["facts"]
    # The daemon's own wiring chose the adapter (under the meter every provider call passes: daemon.metered).
    assert isinstance(unwrap(seen["client"]).transport, LegacyProvider)
    first, second = [f for f in facts if isinstance(f, RequestIntent)][:2]
    made = [f for f in facts if isinstance(f, InstanceFact)]
    assert first.count == 2 and [f.template_id for f in made[:2]] == [first.template_id] * 2
    # Each machine booted with the token whose hash its instance fact carries, and joined as that machine.
    for fact in made[:2]:
        booted = seen["booted"][fact.machine_id]
        assert token_hash(booted["PROVISIONERD_JOIN_TOKEN"]) == fact.token_hash
        assert booted["PROVISIONERD_INSTANCE"] == fact.instance_ref
    assert {h.machine_id for h in seen["hosts"]} == {f.machine_id for f in made[:2]}
    # Demand down: both returned, and the plugin's cloud agrees (verified by the status poll, not just claimed).
    returned = {m for f in facts if isinstance(f, Returned) for m in f.machine_ids}
    assert returned == {f.machine_id for f in made[:2]}
    assert all(seen["after_return"][m]["status"] == "terminated" for m in returned)
    # The reclaim: the machine of the second request, recorded as Lost.
    (lost,) = [f for f in facts if isinstance(f, Lost)]
    assert lost.machine_id == made[2].machine_id and made[2].op_id == second.op_id and lost.reason == "reclaimed"
    # Orphan passes ran and said what they cannot see, never "listing unreadable".
    passes = seen["orphan_passes"]
    assert passes and all(p["listing"] == "absent" and p["invisible"] == ["tagged_unknown", "ghost"] for p in passes)
    assert all("listing_unreadable" not in p["skipped"] for p in passes)
    # The dry-run report: exit 0 (nothing unreadable), the invisible classes per provider, no listMachines call.
    dry = seen["dry_run"]
    assert dry.returncode == 0, dry.stderr.decode()
    report = json.loads(dry.stdout)
    assert report["invisible"] == {"lsfex": ["tagged_unknown", "ghost"]}
    assert report["unknown_outcomes"] == {"lsfex": []} and report["mutations"] == 0
    assert all("listing_unreadable" not in f["blocked_by"] for f in report["findings"])
    table = seen["table"].stdout.decode()
    assert "provider lsfex: cannot list machines; invisible here: tagged_unknown, ghost" in table
    # No join token in the daemon's events log, nor in the reports.
    events = (tmp_path / "events.jsonl").read_text()
    for data in seen["booted"].values():
        assert data["PROVISIONERD_JOIN_TOKEN"] not in events
        assert data["PROVISIONERD_JOIN_TOKEN"].encode() not in dry.stdout + seen["table"].stdout
