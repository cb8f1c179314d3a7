"""The EC2 provider under the real daemon against the emulator, end to end (issue 20, last "Done when"), with real
processes on the real clock:

- ``refcontroller serve`` (a process), ``provisionerd run`` (a process) with the default config plus the ``aws_ec2``
  provider over its persistent transport, two offers (templates ``a-c5-xlarge`` and ``b-m5-xlarge``, the same shape),
  the fake credentials in the provider's ``env``;
- the plugin talks to ``moto_server`` through ``FaultProxy`` (fault_proxy.py), which forwards everything, and in the
  second test answers every RunInstances for ``c5.xlarge`` with EC2's ``InsufficientInstanceCapacity`` (in the
  third, every one after the first: capacity that runs out part-way);
- the test plays each machine's image (moto runs no user-data): once an instance is ``running`` it reads the
  instance's user-data back from the emulator (DescribeInstanceAttribute) and starts ``provisionerd agent`` from
  exactly what it says (join token, controllers, instance ref; daemon_rig.boot_agent, rigs.agents); once the instance is
  ``shutting-down`` or ``terminated`` it stops that agent (the machine is gone).

Demand 3 -> 3 instances, each with the owner tags and ``InstanceInitiatedShutdownBehavior=terminate`` -> 3 agents
joined as those instances -> demand 0 -> the daemon returns them -> all 3 ``terminated`` in the emulator. No fake
AWS key and no join token in any file the run wrote (the daemon's config holds the keys: it is the input).
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from aws_ec2_plugin.config import Config as PluginConfig
from aws_fakes import ACCESS_KEY, SECRET_KEY, SESSION_TOKEN, shutdown_behaviour, tags_of
from botocore.parsers import ResponseParserError
from daemon_rig import OFFERS, PROVIDER, boot_agent, boot_document, ec2_provider
from fault_proxy import FaultProxy
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, machine_counts, machines_gone, make_certs, short_dir
from rigs.facts import stored_facts

from provisionerd.domain.model import DemandItem, InstanceFact, RequestFailed, RequestIntent, ResourceShape, Returned
from provisionerd.domain.tokens import token_hash

pytestmark = pytest.mark.process

DEMAND = 3
UP_LIMIT = 90.0  # demand 3 -> 3 agents joined (measured: a few seconds)
DOWN_LIMIT = 60.0  # demand 0 -> all terminated (idle_time 2 s, then one return)


@pytest.fixture
def state() -> Iterator[Path]:
    """The daemon's state directory (events log, admin socket), with a short path."""
    with short_dir("pd-ec2-") as path:
        yield path


class Machines:
    """The instances of one cluster in the emulator, and the image's part: boot an agent on each running one, stop
    it when its instance goes away."""

    def __init__(self, ec2: Any, cluster: str, certs: Path, root: Path) -> None:
        self.ec2, self.cluster, self.certs, self.root = ec2, cluster, certs, root
        self.agents: dict[str, procs.Proc] = {}
        self.boot_docs: dict[str, dict[str, Any]] = {}  # instance id -> its user-data, as read at boot
        self.shutdown_behaviour: dict[str, str] = {}
        self.terminated: set[str] = set()  # instances whose agent got its SIGTERM (the machine went away)
        self.agent_rcs: dict[str, int] = {}

    def instances(self) -> dict[str, dict[str, Any]]:
        """The cluster's instances as EC2 lists them now; ``{}`` (this poll saw nothing new) when the emulator
        answered a server error: moto's threaded server once answered this image's poll 500 while the plugin's
        RunInstances ran beside it (a fresh-clone CI run), and the next poll, 0.3 s later, reads it again."""
        filters = [{"Name": "tag:provisionerd:cluster", "Values": [self.cluster]}]
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        try:
            return {i["InstanceId"]: i for page in pages for r in page["Reservations"] for i in r["Instances"]}
        except ResponseParserError as exc:  # the emulator's HTML 500 page, not EC2's XML
            if "500 Internal Server Error" not in str(exc):
                raise
            return {}

    def _read_boot(self, instance_id: str) -> tuple[dict[str, Any], str]:
        return boot_document(self.ec2, instance_id), shutdown_behaviour(self.ec2, instance_id)

    async def run(self, started: procs.Procs, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            for instance_id, instance in (await trio.to_thread.run_sync(self.instances)).items():
                state = instance["State"]["Name"]
                if state == "running" and instance_id not in self.boot_docs:
                    doc, behaviour = await trio.to_thread.run_sync(self._read_boot, instance_id)
                    self.boot_docs[instance_id], self.shutdown_behaviour[instance_id] = doc, behaviour
                    home = self.root / instance_id
                    self.agents[instance_id] = await boot_agent(started, doc, self.certs, home)
                elif state in ("shutting-down", "terminated") and instance_id in self.agents:
                    self.stop_agent(instance_id)
            await trio.sleep(0.3)  # the image's polling of the emulator, not an order of events

    def stop_agent(self, instance_id: str) -> None:
        """The machine went away: its agent gets one SIGTERM."""
        if instance_id not in self.terminated:
            self.terminated.add(instance_id)
            self.agents[instance_id].terminate()

    async def stop_all(self) -> None:
        """Every agent's exit code; an agent whose instance is still there gets its SIGTERM now."""
        for instance_id, agent in self.agents.items():
            self.stop_agent(instance_id)
            self.agent_rcs[instance_id] = await procs.reap(agent)


def run_scenario(
    ec2: Any, moto_endpoint: str, tmp: Path, state: Path, refuse_types: set[str], forward_first: int = 0
) -> dict[str, Any]:
    from refcontroller.api import open_refcontroller_process

    cluster = f"ec2e2e-{uuid.uuid4().hex[:8]}"  # the emulator is shared by the session's tests
    certs = make_certs(tmp, cluster)
    seen: dict[str, Any] = {"cluster": cluster}
    machines = Machines(ec2, cluster, certs, tmp / "machines")
    (tmp / "machines").mkdir()

    async def main(proxy: FaultProxy) -> None:
        with (tmp / "ctl.log").open("ab") as ctl_log:
            async with (
                open_refcontroller_process(
                    certs, tmp / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5, stderr=ctl_log.fileno()
                ) as ctl,
                procs.open_procs() as started,
            ):
                provider = ec2_provider(tmp, proxy.url)
                config = daemon_config(certs, ctl.addresses, state, provider, cluster=cluster, identity="prov-ec2-e2e")
                daemon = Daemon.write(config, tmp / "pd.toml", started)
                process = await daemon.start()
                try:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(machines.run, started)
                        await scenario(ctl, daemon)
                        nursery.cancel_scope.cancel()
                finally:
                    with trio.CancelScope(shield=True):
                        await machines.stop_all()
                        seen["daemon_rc"] = await process.stop(15.0)

    async def scenario(ctl: Any, daemon: Daemon) -> None:
        await daemon.wait_held(30)
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), DEMAND)])
        asked = time.monotonic()

        async def joined() -> dict[str, dict[str, Any]] | None:
            hosts = {h["machine_id"]: h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER}
            up = all(h["status"] in ("joined", "idle") for h in hosts.values())
            named = len(hosts) == DEMAND and "" not in hosts and set(hosts) <= set(machines.agents)
            return hosts if up and named else None

        seen["hosts"] = await wait.until(f"{DEMAND} agents joined as named instances", joined, UP_LIMIT)
        seen["up_s"] = time.monotonic() - asked
        seen["instances_up"] = await trio.to_thread.run_sync(machines.instances)
        up = await daemon.wait_status(
            f"the daemon counts {DEMAND} idle machines", lambda s: machine_counts(s, PROVIDER).get("idle") == DEMAND
        )
        seen["machines_up"] = machine_counts(up, PROVIDER)

        await ctl.set_demand([])
        dropped = time.monotonic()

        async def terminated() -> dict[str, dict[str, Any]] | None:
            now = await trio.to_thread.run_sync(machines.instances)
            return now if all(i["State"]["Name"] == "terminated" for i in now.values()) else None

        seen["instances_down"] = await wait.until("every instance terminated in the emulator", terminated, DOWN_LIMIT)
        seen["terminated_s"] = time.monotonic() - dropped
        await daemon.wait_status(
            "no machine left in the daemon's view (Returned committed)",
            machines_gone(PROVIDER),
            DOWN_LIMIT,
        )
        seen["returned_s"] = time.monotonic() - dropped
        seen["hosts_after"] = (await ctl.status())["hosts"]

    with FaultProxy(moto_endpoint, refuse_types=refuse_types, forward_first=forward_first) as proxy:
        trio.run(main, proxy)
        seen["refused"], seen["forwarded"] = proxy.refused(), proxy.forwarded()
    seen["facts"] = stored_facts(tmp / "ctl" / "facts.sqlite")
    seen["boot_docs"], seen["shutdown_behaviour"] = machines.boot_docs, machines.shutdown_behaviour
    seen["agent_rcs"] = machines.agent_rcs
    seen["instance_attr"] = {i: shutdown_behaviour(ec2, i) for i in seen["instances_down"]}
    return seen


def check_end_to_end(seen: dict[str, Any], types: dict[str, int], tmp: Path, state: Path) -> None:
    """Everything the issue's row asks, on one run; ``types``: how many instances of each instance type."""
    facts = seen["facts"]
    intents = {f.op_id: f for f in facts if isinstance(f, RequestIntent)}
    made = {f.machine_id: f for f in facts if isinstance(f, InstanceFact)}
    instances = seen["instances_down"]
    template_of = {instance_type: template_id for template_id, instance_type in OFFERS}

    # --- demand 3 -> exactly 3 instances, of the expected offer, each with the owner tags and shutdown-terminates --
    assert len(instances) == DEMAND and set(instances) == set(made) == set(seen["boot_docs"]), (instances, made)
    assert collections.Counter(i["InstanceType"] for i in instances.values()) == types
    for instance_id, instance in instances.items():
        tags, fact = tags_of(instance), made[instance_id]
        intent = intents[fact.op_id]
        head = seen["boot_docs"][instance_id]["provisionerd"]
        template_id = template_of[instance["InstanceType"]]
        assert fact.template_id == template_id == intent.template_id
        assert tags["provisionerd:cluster"] == seen["cluster"] == head["cluster"]
        assert tags["provisionerd:provider"] == PROVIDER == fact.provider
        assert tags["provisionerd:op"] == fact.op_id and tags["provisionerd:epoch"] == str(intent.epoch)
        assert tags["provisionerd:instance"] == fact.instance_ref == head["instanceRef"]
        assert tags["provisionerd:template"] == template_id
        assert "provisionerd:return-op" in tags  # the daemon's return, not someone else's termination
        assert not any(head["joinToken"] in v for v in tags.values())  # the token is in user-data only
        assert seen["shutdown_behaviour"][instance_id] == "terminate" == seen["instance_attr"][instance_id]
    # --- agents joined through the user-data: each with its instance's token, as that instance -------------------
    for instance_id, doc in seen["boot_docs"].items():
        head = doc["provisionerd"]
        assert token_hash(head["joinToken"]) == made[instance_id].token_hash
        assert token_hash(head["joinToken"]) in intents[made[instance_id].op_id].token_hashes
        assert head["controllers"] and all(a.startswith("127.0.0.1:") for a in head["controllers"])
    assert set(seen["hosts"]) == set(made)
    for machine_id, host in seen["hosts"].items():
        assert host["instance_ref"] == made[machine_id].instance_ref
    assert seen["machines_up"]["idle"] == DEMAND and seen["machines_up"].get("returning", 0) == 0
    # --- demand 0 -> the daemon returned them all, the emulator terminated them, the controller forgot them ------
    assert {m for f in facts if isinstance(f, Returned) for m in f.machine_ids} == set(made)
    assert seen["hosts_after"] == []
    assert seen["daemon_rc"] == 0, "provisionerd run did not exit 0 on SIGTERM"
    assert seen["agent_rcs"] == {m: 0 for m in made}  # one SIGTERM each (its instance went away): a clean stop
    # --- no fake AWS key and no join token in anything the run wrote ----------------------------------------------
    secrets = [ACCESS_KEY, SECRET_KEY, SESSION_TOKEN]
    tokens = [doc["provisionerd"]["joinToken"] for doc in seen["boot_docs"].values()]
    scanned = []
    for path in sorted(p for root in (tmp, state) for p in root.rglob("*") if p.is_file()):
        if path.name == "pd.toml" or path.parent.name == "certs" or path.name.startswith("facts.sqlite"):
            continue  # the operator's config (it holds the keys), the PKI, the controller's store (hashes only)
        data = path.read_text(errors="replace")
        scanned.append(path.name)
        assert not [s for s in (*secrets, *tokens) if s in data], path
    assert {"daemon-1.log", "ctl.log", "events.jsonl", "agent.log"} <= set(scanned), scanned
    assert not [p for p in tmp.rglob("join-token")]  # each agent deleted its copy once read


def test_demand_3_launches_3_instances_whose_agents_join_from_their_user_data_and_demand_0_terminates_them(
    ec2: Any, moto_endpoint: str, tmp_path: Path, state: Path
) -> None:
    seen = run_scenario(ec2, moto_endpoint, tmp_path, state, refuse_types=set())
    check_end_to_end(seen, {"c5.xlarge": DEMAND}, tmp_path, state)  # the first offer in the daemon's order
    assert seen["refused"] == [] and seen["forwarded"] == ["c5.xlarge"] * DEMAND
    assert not [f for f in seen["facts"] if isinstance(f, RequestFailed)]
    print(
        f"3 joined {seen['up_s']:.2f} s after demand 3; demand 0 -> all terminated after {seen['terminated_s']:.2f} s,"
        f" Returned after {seen['returned_s']:.2f} s"
    )


def test_a_capacity_error_for_one_instance_type_falls_over_to_the_next_offer(
    ec2: Any, moto_endpoint: str, tmp_path: Path, state: Path
) -> None:
    seen = run_scenario(ec2, moto_endpoint, tmp_path, state, refuse_types={"c5.xlarge"})
    check_end_to_end(seen, {"m5.xlarge": DEMAND}, tmp_path, state)
    # The first offer was tried first: one RunInstances, made max_attempts times by botocore (the capacity error
    # comes as HTTP 500), then the plugin stopped launching and refused the request with capacity_unavailable.
    assert seen["refused"] == ["c5.xlarge"] * attrs.fields(PluginConfig).max_attempts.default
    assert seen["forwarded"] == ["m5.xlarge"] * DEMAND  # no c5.xlarge RunInstances ever reached the emulator
    intents = [f for f in seen["facts"] if isinstance(f, RequestIntent)]
    failed = {f.op_id: f.reason for f in seen["facts"] if isinstance(f, RequestFailed)}
    first = [i for i in intents if i.template_id == "a-c5-xlarge"]
    assert first and all(i.op_id in failed and "capacity_unavailable" in failed[i.op_id] for i in first), failed
    assert sum(i.count for i in intents if i.template_id == "b-m5-xlarge") == DEMAND
    print(
        f"{len(seen['refused'])} RunInstances refused for c5.xlarge; 3 m5.xlarge joined {seen['up_s']:.2f} s after"
        f" demand 3; demand 0 -> all terminated after {seen['terminated_s']:.2f} s"
    )


def test_capacity_that_runs_out_part_way_is_kept_and_the_rest_comes_from_the_next_offer(
    ec2: Any, moto_endpoint: str, tmp_path: Path, state: Path
) -> None:
    """One c5.xlarge launches, then EC2 has no more: the plugin keeps it and accepts the request with the shortfall
    (``complete_with_error``); the daemon keeps the one machine and asks the next offer for the other two."""
    seen = run_scenario(ec2, moto_endpoint, tmp_path, state, refuse_types={"c5.xlarge"}, forward_first=1)
    check_end_to_end(seen, {"c5.xlarge": 1, "m5.xlarge": DEMAND - 1}, tmp_path, state)
    attempts = attrs.fields(PluginConfig).max_attempts.default
    assert seen["forwarded"].count("c5.xlarge") == 1 and set(seen["refused"]) == {"c5.xlarge"}
    # Each refused RunInstances is made max_attempts times. Today the daemon asks c5 once more for the shortfall
    # (a partial result does not back the template off; the refusal of that second request does): 2 calls.
    assert seen["refused"] and len(seen["refused"]) % attempts == 0, seen["refused"]
    assert seen["forwarded"].count("m5.xlarge") == DEMAND - 1
    intents = [f for f in seen["facts"] if isinstance(f, RequestIntent)]
    assert sum(i.count for i in intents if i.template_id == "b-m5-xlarge") == DEMAND - 1
    print(
        f"1 c5.xlarge then {len(seen['refused'])} refused; 2 m5.xlarge; 3 joined {seen['up_s']:.2f} s after demand 3;"
        f" demand 0 -> all terminated after {seen['terminated_s']:.2f} s"
    )
