"""A batch-launched machine joins as itself and never as another: the plugin on the emulator, the reference
controller's address-bound join on real loopback sockets, each worker connecting from its instance's own address.

The instances are launched into a subnet of 127.0.0.0/16 (the emulator accepts it), so the address EC2 reports for
each is one this host can send from. The test commits the facts as the daemon does (``steps.commit_instances``:
the intent's refs and token hashes, then one InstanceFact per machine of getRequestStatus, with its instanceRef and
privateIpAddress), then plays each machine's agent: the instance id it would read from IMDS, the cluster's bootstrap
secret from its image, and nothing per machine from user-data.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
import trio

from provisionerd.domain.model import InstanceFact, RequestIntent, Role
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import ErrorMsg, FactAck, FactCommit, Join, JoinReply, LeaseAcquire, LeaseGrant, Message
from provisionerd.wire.tls import client_ssl_context
from refcontroller.api import open_refcontroller
from refcontroller.credentials_address import BOOTSTRAP_PREFIX, AddressBoundJoin

pytestmark = pytest.mark.process

SECRET = "cluster-bootstrap-" + "b" * 30


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, "testcluster")
    return directory


#: Every peer a test opened: closed when its scenario ends, whatever happened.
OPEN: list[Peer] = []


class Peer:
    """One TLS connection to the controller, from ``source`` (an address of this host), speaking frames."""

    def __init__(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        self.stream = stream
        self.framed = FramedStream(stream)
        self.corr = 0

    @classmethod
    async def connect(cls, certs: Path, port: int, role: Role, source: str) -> Peer:
        tcp = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
        peer = cls(trio.SSLStream(tcp, client_ssl_context(certs, role), server_hostname="127.0.0.1"))
        OPEN.append(peer)
        return peer

    async def request(self, msg: Message) -> Message:
        self.corr += 1
        await self.framed.send(msg, self.corr)
        while True:
            envelope = await self.framed.receive()
            if envelope.corr == self.corr:
                return envelope.msg


def test_each_machine_joins_as_itself_from_its_address_and_cannot_join_as_another(plugin, ec2, tmp_path, certs):
    octet = random.randrange(1, 250)
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]
    subnet = ec2.create_subnet(VpcId=vpc["VpcId"], CidrBlock=f"127.0.{octet}.0/24")["Subnet"]
    template = {**plugin.config["templates"][0], "join": "address-bound", "subnetId": subnet["SubnetId"]}
    plugin.write_config(templates=[template])
    doc = plugin.request_input("op-join", 2)
    for i, entry in enumerate(doc["bootstrap"]):
        entry["instanceRef"] = f"op-join/{i}"
    with plugin.persistent() as p:
        p.call("requestMachines", doc)
        machines = p.call("getRequestStatus", {"requests": [{"requestId": "op-join"}]})["result"]["requests"][0][
            "machines"
        ]
    assert len(plugin.calls("RunInstances")) == 1 and len(machines) == 2
    a, b = sorted(machines, key=lambda m: m["instanceRef"])
    assert a["privateIpAddress"] != b["privateIpAddress"]
    assert all(m["privateIpAddress"].startswith(f"127.0.{octet}.") for m in machines)
    hashes = {e["instanceRef"]: hashlib.sha256(e["joinToken"].encode()).hexdigest() for e in doc["bootstrap"]}

    async def scenario() -> None:
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=1.0, check_interval=0.5) as ctl:
            assert ctl.server is not None
            ctl.server.address_bound = AddressBoundJoin.from_secret(SECRET)
            port = int(ctl.addresses[0].rsplit(":", 1)[1])
            prov = await Peer.connect(certs, port, Role.PROVISIONER, "127.0.0.1")
            joined = await prov.request(Join(role=Role.PROVISIONER, identity="d1", providers=("aws",)))
            assert isinstance(joined, JoinReply) and joined.accepted
            while not isinstance(grant := await prov.request(LeaseAcquire("aws")), LeaseGrant):  # noqa: ASYNC110
                await trio.sleep(0.1)  # a fresh controller's grace: nothing to wait on but time
            refs = tuple(sorted(hashes))
            facts: list[object] = [
                RequestIntent("aws", grant.epoch, "op-join", "c5-xlarge", 2, refs, tuple(hashes[r] for r in refs))
            ]
            for m in (a, b):
                facts.append(
                    InstanceFact(
                        "aws",
                        grant.epoch,
                        "op-join",
                        m["instanceRef"],
                        m["machineId"],
                        "c5-xlarge",
                        hashes[m["instanceRef"]],
                        m["name"],
                        m["privateIpAddress"],
                    )
                )
            for fact in facts:
                assert isinstance(await prov.request(FactCommit(fact)), FactAck)

            async def claim(machine_id: str, source: str) -> Message:
                peer = await Peer.connect(certs, port, Role.WORKER, source)
                join = Join(
                    role=Role.WORKER, identity=machine_id, machine_id=machine_id, token=BOOTSTRAP_PREFIX + SECRET
                )
                return await peer.request(join)

            # a, from its own address, claims to be b: refused, and b is still free to join.
            stolen = await claim(b["machineId"], a["privateIpAddress"])
            assert isinstance(stolen, ErrorMsg) and stolen.code == "token_invalid", stolen
            own = await claim(a["machineId"], a["privateIpAddress"])
            assert isinstance(own, JoinReply) and own.accepted and own.instance_ref == a["instanceRef"], own
            other = await claim(b["machineId"], b["privateIpAddress"])
            assert isinstance(other, JoinReply) and other.accepted and other.instance_ref == b["instanceRef"], other
            # b once joined, nobody joins as b again, not even from b's address.
            again = await claim(b["machineId"], b["privateIpAddress"])
            assert isinstance(again, ErrorMsg) and again.code == "token_invalid"
            refusals = {k: v.get("worker", 0) for k, v in ctl.server.gate.status()["refusals"].items()}
            assert refusals["address_mismatch"] == 1 and refusals["machine_joined"] == 1

    async def bounded() -> None:
        try:
            with trio.fail_after(60):
                await scenario()
        finally:
            with trio.CancelScope(shield=True):
                while OPEN:
                    await trio.aclose_forcefully(OPEN.pop().stream)

    trio.run(bounded)
