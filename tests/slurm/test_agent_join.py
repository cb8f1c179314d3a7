"""End to end inside Slurm: two pilot jobs run the real worker agent, which joins a real reference controller
(mutual TLS) with the join tokens delivered through the plugin's 0600 files; returning them ends the agents."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest
import trio
from rigs import wait
from rigs.plugin import Persistent
from rigs.slurm import SlurmTestCluster, persistent, plugin_config

from provisionerd.domain.model import RequestIntent, Role
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import FactAck, FactCommit, Join, JoinReply, LeaseAcquire, LeaseGrant, Message
from provisionerd.wire.tls import client_ssl_context
from refcontroller.api import open_refcontroller


class Provisioner:
    """Just enough of the daemon's side of the wire: join, take the lease, commit the intent (token hashes)."""

    def __init__(self, framed: FramedStream) -> None:
        self.framed = framed
        self.corr = 0

    async def request(self, msg: Message) -> Message:
        self.corr += 1
        await self.framed.send(msg, self.corr)
        while True:
            envelope = await self.framed.receive()
            assert envelope is not None, "the controller closed the connection"
            if envelope.corr == self.corr:
                return envelope.msg


@pytest.mark.integration
def test_pilot_agents_join_the_reference_controller_from_inside_slurm(
    clean_cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    client = persistent(tmp_path / "plugin", plugin_config(clean_cluster), "t-e2e")
    try:
        trio.run(_scenario, clean_cluster, client, tmp_path)
    finally:
        client.close()
    assert not clean_cluster.live_jobs()


async def _scenario(cluster: SlurmTestCluster, client: Persistent, tmp_path: Path) -> None:
    certs = cluster.certs
    op_id = "op-e2e"
    refs = (f"{op_id}-i0", f"{op_id}-i1")
    tokens = [secrets.token_urlsafe(24) for _ in refs]
    async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=1.5, check_interval=0.5) as ctl:
        host, port = ctl.addresses[0].rsplit(":", 1)
        stream = await trio.open_ssl_over_tcp_stream(
            host, int(port), ssl_context=client_ssl_context(certs, Role.PROVISIONER)
        )
        async with stream:
            daemon = Provisioner(FramedStream(stream))
            joined = await daemon.request(Join(role=Role.PROVISIONER, identity="d1", providers=("slurm",)))
            assert isinstance(joined, JoinReply) and joined.accepted, joined

            async def granted() -> LeaseGrant | None:
                reply = await daemon.request(LeaseAcquire("slurm"))
                return reply if isinstance(reply, LeaseGrant) else None

            # Denied until the controller's grace after promotion (ttl + check) is over.
            grant = await wait.until("the lease granted", granted, 20, interval=0.1)
            hashes = tuple(hashlib.sha256(t.encode()).hexdigest() for t in tokens)
            intent = RequestIntent(
                provider="slurm",
                epoch=grant.epoch,
                op_id=op_id,
                template_id="node",
                count=2,
                instance_refs=refs,
                token_hashes=hashes,
            )
            assert isinstance(await daemon.request(FactCommit(intent)), FactAck)

            doc = client.request(op_id, "node", 2, controllers=(ctl.addresses[0],), tokens=tokens)
            request_id = (await trio.to_thread.run_sync(client.call, "requestMachines", doc))["requestId"]
            status = await trio.to_thread.run_sync(client.settle, request_id)
            assert status["status"] == "complete" and {m["node"] for m in status["machines"]} == {"n1", "n2"}

            async def both_joined() -> bool:
                hosts = {h["instance_ref"]: h for h in (await ctl.status())["hosts"]}
                return set(refs) <= {ref for ref, h in hosts.items() if h["status"] in ("joined", "idle", "busy")}

            # A Python agent starting on a loaded 2-core machine: 60 s.
            await wait.until("both pilots' agents to join", both_joined, 60, interval=0.3)
            machines = status["machines"]
            ret = await trio.to_thread.run_sync(client.give_back, "op-e2e-ret", machines)
            done = await trio.to_thread.run_sync(client.settle, ret["requestId"])
            assert done["status"] == "complete"
    logs = "".join(p.read_text() for p in (cluster.workdir / "logs").glob("*.out") if "pvd-" in p.name)
    assert "stopping on SIGTERM" in logs and not any(t in logs for t in tokens)
