"""A demand of 100 under the real daemon, on one ``join: address-bound`` template, against the emulator: real
processes on the real clock (``refcontroller serve --address-bound-join``, ``provisionerd run``, the plugin over
its persistent transport, ``moto_server`` behind the forwarding ``FaultProxy`` that counts RunInstances).

What it shows: with the provider's ``step_limit`` at 100, the daemon's one request for 100 becomes at most 2
RunInstances (1 measured), every instance carries the owner tags from its creation, and the daemon commits 100
InstanceFacts, each with its own instance ref (from the batch's slot tags) and the address EC2 reported, which is
what the address-bound join admits a machine by (test_batch_join.py plays those joins from the machines' own
addresses; here no agent runs: moto's addresses are not this host's).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from aws_fakes import IMAGE, REGION, tags_of
from daemon_rig import PROVIDER, ec2_provider
from fault_proxy import FaultProxy
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir
from rigs.facts import stored_facts

from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape

pytestmark = pytest.mark.process

DEMAND = 100
LIMIT = 120.0


def test_a_demand_of_100_is_at_most_2_launch_calls_and_100_facts_with_their_own_refs(
    ec2: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    from refcontroller.api import open_refcontroller_process

    cluster = f"ec2batch-{uuid.uuid4().hex[:8]}"
    certs = make_certs(tmp_path, cluster)
    secret = tmp_path / "bootstrap"
    secret.write_text("cluster-bootstrap-" + uuid.uuid4().hex)
    os.chmod(secret, 0o600)
    seen: dict[str, Any] = {}

    def instances() -> list[dict[str, Any]]:
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:provisionerd:cluster", "Values": [cluster]}]
        )
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    async def main(proxy: FaultProxy, state: Path) -> None:
        with (tmp_path / "ctl.log").open("ab") as ctl_log:
            async with (
                open_refcontroller_process(
                    certs,
                    tmp_path / "ctl",
                    replicas=1,
                    lease_ttl=2.0,
                    check_interval=0.5,
                    stderr=ctl_log.fileno(),
                    address_bound_join=secret,
                ) as ctl,
                procs.open_procs() as started,
            ):
                # The daemon asks a provider for at most its step at once (docs/operations.md, step_limit: from
                # 10, doubling per accepted round trip): with the default, demand 100 is 5 requests (10, 10, 20, 40,
                # 20), each one RunInstances. A site whose EC2 templates launch in batches sets the step to the batch.
                provider = attrs.evolve(ec2_provider(tmp_path, proxy.url), step_limit=DEMAND, max_machines=2 * DEMAND)
                template = {
                    "templateId": "c5-xlarge-batch",
                    "instanceType": "c5.xlarge",
                    "imageId": IMAGE,
                    "maxNumber": 500,
                    "join": "address-bound",
                    "attributes": {"type": ["String", "X86_64"], "ncpus": ["Numeric", "4"], "mem": ["Numeric", "8192"]},
                }
                plugin = {"region": REGION, "endpoint_url": proxy.url, "read_timeout": 20, "templates": [template]}
                (tmp_path / "ec2-conf" / "aws_ec2.json").write_text(json.dumps(plugin))
                config = daemon_config(certs, ctl.addresses, state, provider, cluster=cluster, identity="prov-batch")
                daemon = Daemon.write(config, tmp_path / "pd.toml", started)
                process = await daemon.start()
                try:
                    await daemon.wait_held(30)
                    await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), DEMAND)])
                    asked = time.monotonic()

                    async def all_made() -> list[InstanceFact] | None:
                        facts = await trio.to_thread.run_sync(stored_facts, tmp_path / "ctl" / "facts.sqlite")
                        made = [f for f in facts if isinstance(f, InstanceFact)]
                        return made if len(made) >= DEMAND else None

                    await wait.until(f"{DEMAND} InstanceFacts committed", all_made, LIMIT)
                    seen["facts_s"] = time.monotonic() - asked
                finally:
                    with trio.CancelScope(shield=True):
                        seen["daemon_rc"] = await process.stop(15.0)

    with short_dir("pd-ec2b-") as state, FaultProxy(moto_endpoint, refuse_types=set()) as proxy:
        trio.run(main, proxy, state)
        seen["forwarded"] = proxy.forwarded()
    facts = stored_facts(tmp_path / "ctl" / "facts.sqlite")
    intents = [f for f in facts if isinstance(f, RequestIntent)]
    made = {f.machine_id: f for f in facts if isinstance(f, InstanceFact)}
    found = {i["InstanceId"]: i for i in instances()}

    assert len(seen["forwarded"]) <= 2, seen["forwarded"]
    assert len(found) == DEMAND == len(made) and set(found) == set(made)
    assert sum(i.count for i in intents) == DEMAND
    refs = {r for i in intents for r in i.instance_refs}
    assert {f.instance_ref for f in made.values()} == refs  # each machine its own ref of the intent, none twice
    for machine_id, fact in made.items():
        instance, tags = found[machine_id], tags_of(found[machine_id])
        assert fact.address == instance["PrivateIpAddress"] and fact.address
        assert tags["provisionerd:cluster"] == cluster and tags["provisionerd:op"] == fact.op_id
        assert tags["provisionerd:provider"] == PROVIDER and tags["provisionerd:template"] == "c5-xlarge-batch"
    assert len({f.address for f in made.values()}) == DEMAND
    assert seen["daemon_rc"] == 0
    print(
        f"demand {DEMAND}: {len(seen['forwarded'])} RunInstances ({seen['forwarded']}), {len(intents)} intents,"
        f" {DEMAND} InstanceFacts {seen['facts_s']:.2f} s after the demand"
    )
