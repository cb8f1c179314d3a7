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
from typing import Any

import pytest
import trio
from rigs import procs, wait
from rigs.core import daemon_core, running
from rigs.daemon import daemon_config, make_certs, short_dir
from rigs.facts import facts_of

from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.cli.agent import tls_connector as worker_connector
from provisionerd.config.loader import LegacyOptions, OrphanSettings
from provisionerd.config.writer import write_daemon_config
from provisionerd.daemon.metered import unwrap
from provisionerd.domain.model import DemandItem, InstanceFact, Lost, RequestIntent, ResourceShape, Returned
from provisionerd.domain.tokens import token_hash
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from provisionerd.provider.legacy.adapter import LegacyProvider

pytestmark = pytest.mark.process


def logged(ctl: Any, kind: type) -> list[Any]:
    """The facts of ``kind`` in the in-process controller's log."""
    return facts_of(ctl.server.cluster.store, kind)


CLUSTER = "testcluster"
#: The userData recipe of docs/providers.md: what each machine boots with.
USER_DATA = {
    "PROVISIONERD_JOIN_TOKEN": "{join_token}",
    "PROVISIONERD_CONTROLLERS": "{controllers}",
    "PROVISIONERD_INSTANCE": "{instance_ref}",
}


def test_an_lsf_plugin_runs_the_whole_lifecycle_under_the_daemon(world: Any, tmp_path):
    from refcontroller.api import open_refcontroller

    certs = make_certs(tmp_path, CLUSTER)
    world.settings({"BOOT_POLLS": 1})
    provider = world.daemon_provider(
        max_machines=10,
        provisioning_timeout=60,
        orphans=OrphanSettings(interval=0.5, settle=0),
        legacy=LegacyOptions(journal=tmp_path / "lsfex.journal.json", user_data=USER_DATA),
    )
    seen: dict[str, Any] = {}

    async def main(state) -> None:
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5) as ctl:
            config = daemon_config(certs, ctl.addresses, state, provider, cluster=CLUSTER, identity="prov-legacy")
            config = write_daemon_config(config, tmp_path / "pd.toml")
            policy = Policy(
                cluster=CLUSTER,
                idle_time=1.0,
                join_deadline=120.0,
                provisioning_timeout=config.provider("lsfex").provisioning_timeout,
            )
            loop = LoopSettings(replan_interval=0.5, reclaim_interval=0.5, recover_after=10.0)
            core = daemon_core(config, policy=policy, loop=loop)
            seen["client"] = core.providers["lsfex"]
            async with running(core) as nursery:
                await scenario(ctl, core, nursery)
            seen["events"] = config.daemon.events_log.read_text()
            # The admin's dry run against the same config (its own process, its own adapter over the journal).
            orphans = procs.provisionerd("orphans", "--config", tmp_path / "pd.toml", "--dry-run")
            seen["dry_run"] = await procs.run_async([*orphans, "--json"])
            seen["table"] = await procs.run_async(orphans)

    async def scenario(ctl: Any, core: Any, nursery: trio.Nursery) -> None:
        def until(what: str, predicate: Any) -> Any:
            return wait.until_sync(what, predicate, 40)

        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])
        await until("2 instance facts", lambda: len(logged(ctl, InstanceFact)) == 2)
        # The machines boot: each reads its userData and starts the worker agent (docs/providers.md's recipe).
        connect = worker_connector(certs)
        booted = {}
        for fact in logged(ctl, InstanceFact):
            data = world.user_data_of(fact.machine_id)
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
        await until("2 hosts joined", lambda: len(ctl.server.cluster.hosts.all()) == 2)
        seen["hosts"] = ctl.server.cluster.hosts.all()
        seen["booted"] = booted
        await ctl.set_demand([])
        await until("2 machines returned", lambda: sum(len(f.machine_ids) for f in logged(ctl, Returned)) == 2)
        seen["after_return"] = world.plugin_machines()
        # Demand again; the cloud then takes the new machine back.
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 1)])
        await until("a third instance fact", lambda: len(logged(ctl, InstanceFact)) == 3)
        world.settings({"BOOT_POLLS": 1, "RECLAIM_COUNT": 1})
        await until("the reclaimed machine Lost", lambda: logged(ctl, Lost))
        # Demand still wants one machine: the planner replaces the lost one (let it finish before shutting down,
        # or the cancelled call would rightly be reported as an unknown outcome).
        await until("the lost machine's replacement", lambda: len(logged(ctl, InstanceFact)) == 4)
        seen["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        seen["orphan_passes"] = [e for e in core.events.recent if e["event"] == "orphan_pass"]

    with short_dir("pd-lgd-") as state:
        trio.run(main, state)
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
    # Orphan passes ran and said what they cannot see, never "listing unreadable". Only the first, at start, may
    # have been skipped before the link was up (``view_unreadable``: a pass without the view lists nothing).
    passes = [p for p in seen["orphan_passes"] if p.get("listed") is not False]
    early = [p for p in seen["orphan_passes"] if p.get("listed") is False]
    assert len(early) <= 1 and all(set(p["skipped"]) == {"view_unreadable"} for p in early)
    assert passes and all(p["listing"] == "absent" and p["invisible"] == ["tagged_unknown", "ghost"] for p in passes)
    assert all("listing_unreadable" not in p["skipped"] for p in passes)
    # The dry-run report: exit 0 (nothing unreadable), the invisible classes per provider, no listMachines call.
    dry = seen["dry_run"]
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["invisible"] == {"lsfex": ["tagged_unknown", "ghost"]}
    assert report["unknown_outcomes"] == {"lsfex": []} and report["mutations"] == 0
    assert all("listing_unreadable" not in f["blocked_by"] for f in report["findings"])
    table = seen["table"].stdout
    assert "provider lsfex: cannot list machines; invisible here: tagged_unknown, ghost" in table
    # No join token in the daemon's events log, nor in the reports.
    events = seen["events"]
    for data in seen["booted"].values():
        assert data["PROVISIONERD_JOIN_TOKEN"] not in events
        assert data["PROVISIONERD_JOIN_TOKEN"] not in dry.stdout + seen["table"].stdout
