"""A spot interruption notice, end to end (issue 34, item 4, "Done when"), with real processes on the real clock:

- ``refcontroller serve``, ``provisionerd run`` with the ``aws_ec2`` provider against the emulator (moto), and the
  test playing each machine's image (test_daemon_end_to_end.Machines: an agent booted from each running instance's
  user-data, stopped when the instance goes away);
- the first instance's "image" also starts AWS's own metadata mock (``amazon-ec2-metadata-mock``, IMDSv2 only) for
  it and its agent with ``--imds`` (``--imds-interval 1``): the mock announces a spot interruption
  ``NOTICE_AFTER`` s after it starts, for ``LEAD`` s later (EC2 gives 120 s; shortened so the deadline binds);
- that machine is busy (its agent got SIGUSR1), so it is drained, not returned at once.

Demand 2 -> 2 machines joined -> the notice -> a replacement requested and joined, the doomed machine drained and
returned (its instance ``shutting-down`` in the emulator) before the interruption's time, and 2 machines idle or
busy in the daemon's count after it: 0 unmet demand. The timings are printed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from daemon_rig import PROVIDER, boot_document, ec2_provider
from fault_proxy import FaultProxy
from rigs import agents, imds, procs, wait
from rigs.daemon import Daemon, daemon_config, machine_counts, make_certs, short_dir
from rigs.facts import stored_facts
from test_daemon_end_to_end import Machines

from provisionerd.domain.model import DemandItem, DrainRequested, RequestIntent, ResourceShape, ReturnIntent
from provisionerd.planner.drain import RECLAIM_MARGIN

pytestmark = pytest.mark.integration

DEMAND = 2
NOTICE_AFTER = 8  # s after the doomed machine's metadata service starts (its agent joins well before)
LEAD = 45.0  # s from the notice to the interruption (EC2: 120)
LIMIT = 90.0


@pytest.fixture
def state() -> Iterator[Path]:
    with short_dir("pd-spot-") as path:
        yield path


class SpotMachines(Machines):
    """``Machines`` whose first instance is a spot instance with a metadata service announcing its interruption."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.doomed = ""
        self.mock: imds.Imds | None = None
        self.reclaim_at = 0.0

    async def run(self, started: procs.Procs, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            for instance_id, instance in (await trio.to_thread.run_sync(self.instances)).items():
                state = instance["State"]["Name"]
                if state == "running" and instance_id not in self.boot_docs:
                    doc = await trio.to_thread.run_sync(boot_document, self.ec2, instance_id)
                    self.boot_docs[instance_id] = doc
                    home = self.root / instance_id
                    extra: list[str] = []
                    if not self.doomed:
                        self.doomed = instance_id
                        at = time.time()
                        self.reclaim_at = float(int(at + NOTICE_AFTER + LEAD))  # the mock's time has whole seconds
                        stamp = datetime.fromtimestamp(self.reclaim_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                        self.mock = await imds.start(
                            started, home / "imds", instance_id=instance_id, spot_delay=NOTICE_AFTER, spot_time=stamp
                        )
                        extra = ["--imds", self.mock.url, "--imds-interval", "1"]
                    head = doc["provisionerd"]
                    token = agents.token_file(home, head["joinToken"])
                    self.agents[instance_id] = await agents.boot(
                        started,
                        home,
                        self.certs,
                        head["controllers"],
                        token,
                        "--instance-ref",
                        head["instanceRef"],
                        *extra,
                    )
                elif state in ("shutting-down", "terminated") and instance_id in self.agents:
                    self.stop_agent(instance_id)
            await trio.sleep(0.3)  # the image's polling of the emulator, not an order of events


def test_a_spot_interruption_notice_gets_a_replacement_joined_and_the_machine_returned_before_the_deadline(
    ec2: Any, moto_endpoint: str, tmp_path: Path, state: Path
) -> None:
    from refcontroller.api import open_refcontroller_process

    cluster = f"spot-{uuid.uuid4().hex[:8]}"
    certs = make_certs(tmp_path, cluster)
    (tmp_path / "machines").mkdir()
    machines = SpotMachines(ec2, cluster, certs, tmp_path / "machines")
    seen: dict[str, Any] = {}
    marks: dict[str, float] = {}  # event -> wall time first seen (polled every 0.2 s)

    async def watch(ctl: Any, daemon: Daemon) -> None:
        while True:
            now = time.time()
            hosts = {h["machine_id"]: h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER}
            doomed = hosts.get(machines.doomed)
            if doomed is not None and doomed["reclaim_at"] > 0:
                marks.setdefault("controller_has_notice", now)
                seen["noticed_host"] = doomed
            if machines.doomed and doomed is not None and doomed.get("draining"):
                marks.setdefault("drain_committed", now)
            instances = await trio.to_thread.run_sync(machines.instances)
            others = [i for i in instances if i != machines.doomed and i not in seen.get("first", set())]
            if "first" in seen and others:
                marks.setdefault("replacement_launched", now)
                replacement = others[0]
                host = next((h for h in hosts.values() if h["machine_id"] == replacement), None)
                if host is not None and host["status"] in ("joined", "idle"):
                    marks.setdefault("replacement_joined", now)
            gone = instances.get(machines.doomed, {}).get("State", {}).get("Name") in ("shutting-down", "terminated")
            if machines.doomed and gone:
                marks.setdefault("doomed_returned", now)
            await trio.sleep(0.2)

    async def main(proxy: FaultProxy) -> None:
        with (tmp_path / "ctl.log").open("ab") as ctl_log:
            async with (
                open_refcontroller_process(
                    certs, tmp_path / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5, stderr=ctl_log.fileno()
                ) as ctl,
                procs.open_procs() as started,
            ):
                provider = ec2_provider(tmp_path, proxy.url)
                config = daemon_config(certs, ctl.addresses, state, provider, cluster=cluster, identity="prov-spot")
                daemon = Daemon.write(config, tmp_path / "pd.toml", started)
                process = await daemon.start()
                try:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(machines.run, started)
                        await scenario(ctl, daemon, nursery)
                        nursery.cancel_scope.cancel()
                finally:
                    with trio.CancelScope(shield=True):
                        await machines.stop_all()
                        seen["daemon_rc"] = await process.stop(15.0)

    async def scenario(ctl: Any, daemon: Daemon, nursery: trio.Nursery) -> None:
        await daemon.wait_held(30)
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), DEMAND)])

        async def joined() -> dict[str, Any] | None:
            hosts = {h["machine_id"]: h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER}
            up = all(h["status"] in ("joined", "idle") for h in hosts.values())
            return hosts if up and len(hosts) == DEMAND and set(hosts) <= set(machines.agents) else None

        first = await wait.until(f"{DEMAND} agents joined", joined, LIMIT)
        seen["first"] = set(first)
        nursery.start_soon(watch, ctl, daemon)
        assert machines.doomed in first and machines.mock is not None
        # The doomed machine runs work: it must drain, not go at once.
        agent = machines.agents[machines.doomed]
        os.kill(agent.pid, signal.SIGUSR1)  # the agent reports busy
        await wait.until(
            "the doomed machine busy",
            lambda: _host_status(ctl, machines.doomed, "busy"),
            20.0,
        )
        marks["busy"] = time.time()

        async def after() -> dict[str, Any] | None:
            # The reference controller keeps a returned machine's host (lost once its agent is gone) until every
            # machine of its intent has ended: the live hosts are the others.
            hosts = {
                h["machine_id"]: h["status"]
                for h in (await ctl.status())["hosts"]
                if h["provider"] == PROVIDER and h["machine_id"] != machines.doomed
            }
            seen["probe"] = (dict(marks), machines.doomed, hosts, machine_counts(await daemon.status(), PROVIDER))
            if not {"doomed_returned", "replacement_joined"} <= set(marks):
                return None
            if len(hosts) != DEMAND or not all(s in ("joined", "idle", "busy") for s in hosts.values()):
                return None
            counts = machine_counts(await daemon.status(), PROVIDER)
            live = counts.get("idle", 0) + counts.get("busy", 0)
            return counts if live == DEMAND and not counts.get("returning") and not counts.get("booting") else None

        try:
            seen["counts_after"] = await wait.until(
                "a replacement joined, the doomed machine returned, demand met", after, NOTICE_AFTER + LEAD + LIMIT
            )
        except wait.WaitTimeout as exc:
            raise AssertionError(f"{exc}; last seen (marks, doomed, hosts, daemon counts): {seen['probe']}") from None
        marks["demand_met"] = time.time()
        seen["hosts_after"] = {h["machine_id"]: h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER}

    with FaultProxy(moto_endpoint, refuse_types=set()) as proxy:
        trio.run(main, proxy)
    facts = stored_facts(tmp_path / "ctl" / "facts.sqlite")
    doomed, reclaim_at = machines.doomed, machines.reclaim_at
    t0 = marks["controller_has_notice"]  # the notice on the controller's host (the agent polls IMDS every 1 s)
    rel = {k: round(v - t0, 2) for k, v in sorted(marks.items(), key=lambda kv: kv[1])}
    print(
        f"\nspot interruption (s from the notice reaching the controller's host table): deadline"
        f" {reclaim_at - t0:.2f} (the doomed machine is busy: returned at deadline - {RECLAIM_MARGIN:g} s); {rel};"
        f" daemon counts after: {seen['counts_after']}"
    )
    # --- the notice went agent -> controller -> daemon ------------------------------------------------------------
    assert seen["noticed_host"]["reclaim_at"] == reclaim_at
    drains = [f for f in facts if isinstance(f, DrainRequested)]
    assert [(f.machine_ids, f.reason) for f in drains] == [((doomed,), "reclaim")]
    # --- a replacement was requested (after the notice) and joined, before the doomed machine was returned ----------
    intents = [f for f in facts if isinstance(f, RequestIntent)]
    assert len(intents) >= 2 and sum(f.count for f in intents) == DEMAND + 1
    returns = [f for f in facts if isinstance(f, ReturnIntent)]
    assert [(f.machine_ids, f.reason) for f in returns] == [((doomed,), "reclaim_deadline")]
    assert marks["replacement_joined"] < marks["doomed_returned"] < reclaim_at
    # --- 0 unmet demand after: DEMAND machines joined besides the doomed one, which is gone or lost ----------------
    live = {m: h["status"] for m, h in seen["hosts_after"].items() if m != doomed}
    assert len(live) == DEMAND and set(live.values()) <= {"joined", "idle", "busy"}, seen["hosts_after"]
    # The controller may still list the doomed host (busy, draining) until its heartbeat timeout: no work goes there.
    assert seen["hosts_after"].get(doomed, {"draining": True})["draining"]
    assert seen["counts_after"]["idle"] + seen["counts_after"]["busy"] == DEMAND
    assert seen["daemon_rc"] == 0


async def _host_status(ctl: Any, machine_id: str, status: str) -> bool:
    hosts = (await ctl.status())["hosts"]
    return any(h["machine_id"] == machine_id and h["status"] == status for h in hosts)
