"""The issue's end-to-end check: the simulated provider (real plugin processes) holds a never-joined machine, a
tagged unknown machine and untagged machines, the reference controller holds a ghost fact, and
``provisionerd orphans --dry-run --json`` (a real subprocess, mutual TLS) lists exactly the never-joined, the
tagged unknown and the ghost, with the right classes and actions, and changes nothing anywhere."""

from __future__ import annotations

import hashlib
import json
import secrets
import time

import pytest
import sim_state
import trio
from real_world import SECRET, sim
from rigs import procs
from rigs.daemon import daemon_config, make_certs
from rigs.lease_holder import holding_lease

from provisionerd.config.writer import write_daemon_config
from provisionerd.daemon.clients import open_clients
from provisionerd.domain.model import (
    NO_EPOCH,
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_OP,
    TAG_PROVIDER,
    InstanceFact,
    RequestIntent,
)

pytestmark = pytest.mark.process

CLUSTER = "testcluster"


async def create_one(client, op_id: str, ref: str, token: str, controllers) -> str:
    """Ask the simulated provider for one machine with this cluster's owner tags; its machine id."""
    tags = {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: "sim", TAG_OP: op_id, TAG_EPOCH: "1.1"}
    answer = await client.call(
        "requestMachines",
        {
            "template": {"templateId": "sim-cpu-8", "machineCount": 1},
            "op_id": op_id,
            "tags": tags,
            "bootstrap": [{"instanceRef": ref, "controllers": list(controllers), "joinToken": token}],
        },
    )
    status = await client.call("getRequestStatus", {"requests": [{"requestId": answer["requestId"]}]})
    (machine,) = status["requests"][0]["machines"]
    return machine["machineId"]


def test_dry_run_lists_never_joined_tagged_unknown_and_ghost_and_changes_nothing(tmp_path, sock_dir):
    from refcontroller.api import open_refcontroller

    certs, config_path = make_certs(tmp_path, CLUSTER), tmp_path / "pd.toml"
    provider = sim(tmp_path)
    data = provider.data_dir
    seen: dict = {}
    token = secrets.token_urlsafe(24)
    long_ago = int(time.time()) - 3600  # past the join deadline (900 s) and the orphan grace (1800 s)

    async def main():
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=5.0, check_interval=0.5) as ctl:
            config = daemon_config(certs, ctl.addresses, sock_dir, provider, cluster=CLUSTER, identity="prov-main")
            config = write_daemon_config(config, config_path)
            async with open_clients(config, ["sim"]) as clients:
                never_joined = await create_one(
                    clients["sim"].transport, "op-nj", "testcluster/op-nj/0", token, ctl.addresses
                )
                stray = await create_one(
                    clients["sim"].transport,
                    "op-stray",
                    "testcluster/op-stray/0",
                    secrets.token_urlsafe(24),
                    ctl.addresses,
                )
            sim_state.backdate(data, never_joined, long_ago)
            sim_state.backdate(data, stray, long_ago)
            sim_state.plant_machine(data, "i-untagged", {}, long_ago, n=1)
            sim_state.plant_machine(data, "i-cluster-only", {TAG_CLUSTER: CLUSTER}, long_ago, n=2)
            ghost_hash = hashlib.sha256(b"ghost token").hexdigest()
            token_hash = hashlib.sha256(token.encode()).hexdigest()
            async with holding_lease(config, "sim") as holder:  # a provisioner holding the lease, nothing else
                await holder.commit(
                    RequestIntent("sim", NO_EPOCH, "op-nj", "sim-cpu-8", 1, ("testcluster/op-nj/0",), (token_hash,)),
                    InstanceFact(
                        "sim",
                        NO_EPOCH,
                        "op-nj",
                        "testcluster/op-nj/0",
                        never_joined,
                        "sim-cpu-8",
                        token_hash,
                        launch_time=float(long_ago),
                    ),
                    RequestIntent(
                        "sim", NO_EPOCH, "op-ghost", "sim-cpu-8", 1, ("testcluster/op-ghost/0",), (ghost_hash,)
                    ),
                    InstanceFact(
                        "sim",
                        NO_EPOCH,
                        "op-ghost",
                        "testcluster/op-ghost/0",
                        "i-ghost",
                        "sim-cpu-8",
                        ghost_hash,
                        launch_time=float(long_ago),
                    ),
                )
            cluster = ctl.server.cluster
            state_before = sim_state.read(data)
            facts_before = [c.index for c in cluster.store.all_facts()]
            result = await procs.run_async(
                procs.provisionerd("orphans", "--config", config_path, "--dry-run", "--json")
            )
            seen.update(
                result=result,
                state_before=state_before,
                state_after=sim_state.read(data),
                facts_before=facts_before,
                facts_after=[c.index for c in cluster.store.all_facts()],
                leases=cluster.leases.live_leases(trio.current_time()),
                sessions=(await ctl.status())["sessions"],
                ids={"never_joined": never_joined, "stray": stray},
            )

    trio.run(main)
    result = seen["result"]
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    got = {(f["class"], f["machine_id"], f["action"]) for f in report["findings"]}
    assert got == {
        ("never_joined", seen["ids"]["never_joined"], "return"),
        ("tagged_unknown", seen["ids"]["stray"], "report"),
        ("ghost", "i-ghost", "retire"),
    }
    assert report["mutations"] == 0
    for finding in report["findings"]:
        assert set(finding) == {"class", "provider", "machine_id", "evidence", "action", "blocked_by"}
        assert finding["provider"] == "sim"
        assert "no_lease" in finding["blocked_by"] and "dry_run" in finding["blocked_by"]
    by_class = {f["class"]: f for f in report["findings"]}
    assert by_class["never_joined"]["evidence"]["returned_by"] == "reconciler"
    assert by_class["never_joined"]["evidence"]["age"] >= 3600
    assert by_class["tagged_unknown"]["evidence"]["tags"][TAG_OP] == "op-stray"
    assert by_class["ghost"]["evidence"]["not_found_reads"] == 1
    assert "ghost_unconfirmed" in by_class["ghost"]["blocked_by"]
    # Untagged machines are not in the report at all, under any class.
    assert "i-untagged" not in result.stdout and "i-cluster-only" not in result.stdout
    # Nothing changed: the provider's state, the controller's log, the leases.
    assert seen["state_after"] == seen["state_before"]
    assert seen["facts_after"] == seen["facts_before"]
    assert seen["leases"] == []
    # Secrets: neither the credential nor the join token reaches the output.
    for stream in (result.stdout, result.stderr):
        assert SECRET not in stream and token not in stream
