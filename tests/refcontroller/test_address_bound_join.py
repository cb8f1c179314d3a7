"""The opt-in address-bound join (issue 19, ``refcontroller/credentials_address.py``) on real loopback sockets.

A worker claiming machine M with the cluster's bootstrap secret is admitted once, as M's instance, only while that
instance is unjoined and only from the address the provider reported for M. Each refusal is answered
``errorMsg{tokenInvalid}`` and counted under its own reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
import trio
from rc_client import Peer, on_real_clock, seq_term, tls_peer
from rc_factories import instance, intent

from provisionerd.domain.model import Epoch, Returned, Role
from provisionerd.wire.messages import (
    ErrorMsg,
    FactAck,
    FactCommit,
    Heartbeat,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseGrant,
    Message,
)
from refcontroller.api import RefController, open_refcontroller
from refcontroller.cli import main
from refcontroller.credentials_address import BOOTSTRAP_PREFIX, AddressBoundJoin
from refcontroller.server import ControllerServer

SECRET = "cluster-bootstrap-" + "s" * 30
BOOTSTRAP = BOOTSTRAP_PREFIX + SECRET
REFS = ("i-ok", "i-far", "i-dup1", "i-dup2", "i-none", "i-own", "i-gone")


async def provisioner(certs: Path, ctl: RefController) -> tuple[Peer, Epoch]:
    peer = await tls_peer(certs, ctl.addresses[0], Role.PROVISIONER)
    reply = await peer.request(Join(role=Role.PROVISIONER, identity="d1", providers=("aws",)))
    assert isinstance(reply, JoinReply) and reply.accepted, reply
    while not isinstance(grant := await peer.request(LeaseAcquire("aws")), LeaseGrant):  # noqa: ASYNC110
        await trio.sleep(0.1)  # the grace of a fresh controller: nothing to wait on but time
    return peer, grant.epoch


async def worker(certs: Path, ctl: RefController, machine_id: str, token: str = BOOTSTRAP, ref: str = "") -> Message:
    peer = await tls_peer(certs, ctl.addresses[0], Role.WORKER)
    join = Join(role=Role.WORKER, identity=machine_id or ref, machine_id=machine_id, instance_ref=ref, token=token)
    return await peer.request(join)


def refusals(server: ControllerServer) -> dict[str, int]:
    return {reason: roles.get("worker", 0) for reason, roles in server.gate.status()["refusals"].items()}


@on_real_clock
async def test_admitted_once_from_the_reported_address_and_every_refusal(certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=1, lease_ttl=1.0, check_interval=0.5) as ctl:
        assert ctl.server is not None
        ctl.server.address_bound = AddressBoundJoin.from_secret(SECRET)
        prov, epoch = await provisioner(certs, ctl)
        facts = [intent("aws", epoch, refs=REFS)]
        at = {"i-ok": "127.0.0.1", "i-far": "10.9.9.9", "i-dup1": "127.0.0.1", "i-dup2": "127.0.0.1"}
        at |= {"i-none": "", "i-own": "127.0.0.1", "i-gone": "127.0.0.1"}
        for ref in REFS:
            fact = instance("aws", epoch, ref)
            fact = attrs.evolve(
                fact, machine_id="m-dup" if ref.startswith("i-dup") else fact.machine_id, address=at[ref]
            )
            facts.append(fact)
        facts.append(Returned("aws", epoch, "ret-1", ("m-i-gone",)))
        for fact in facts:
            assert isinstance(await prov.request(FactCommit(fact)), FactAck)
        # i-own's own agent joins with its token first: its machine is joined, an address-bound claim is refused.
        own = await worker(certs, ctl, "", token="tok-i-own", ref="i-own")
        assert isinstance(own, JoinReply) and own.accepted and own.instance_ref == ""

        reply = await worker(certs, ctl, "m-i-ok")
        assert isinstance(reply, JoinReply) and reply.accepted, reply
        assert reply.instance_ref == "i-ok" and reply.credential.startswith("cred-v1:")
        hosts = {h["instance_ref"]: h["machine_id"] for h in (await ctl.status())["hosts"]}
        assert hosts["i-ok"] == "m-i-ok"

        expected = {
            "m-i-ok": "machine_joined",  # once
            "m-i-own": "machine_joined",  # joined with its token before
            "m-i-gone": "machine_joined",  # returned
            "m-i-far": "address_mismatch",  # reported at 10.9.9.9, the claim comes from 127.0.0.1
            "m-i-none": "address_mismatch",  # no address reported
            "m-dup": "machine_unknown",  # two instances name it
            "m-nobody": "machine_unknown",
        }
        for machine_id in expected:
            answer = await worker(certs, ctl, machine_id)
            assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid", (machine_id, answer)
        answer = await worker(certs, ctl, "m-i-far", token=BOOTSTRAP_PREFIX + "another-secret-of-the-right-size")
        assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid" and SECRET not in answer.message
        answer = await worker(certs, ctl, "m-i-far", token=SECRET)  # the secret without its prefix
        assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid"
        counted = refusals(ctl.server)
        assert counted["machine_joined"] == 3 and counted["address_mismatch"] == 2
        assert counted["machine_unknown"] == 2 and counted["bootstrap_invalid"] == 2

        # From now on i-ok is a worker like any other: it rejoins with its credential; its token is spent.
        peer = await tls_peer(certs, ctl.addresses[0], Role.WORKER)
        again = await peer.request(
            Join(role=Role.WORKER, identity="m-i-ok", instance_ref="i-ok", token=reply.credential)
        )
        assert isinstance(again, JoinReply) and again.accepted and again.credential == ""
        assert seq_term(await peer.request(Heartbeat(1)))[0] == 1
        spent = await worker(certs, ctl, "", token="tok-i-ok", ref="i-ok")
        assert isinstance(spent, ErrorMsg) and spent.code == "token_invalid"


@on_real_clock
async def test_without_the_option_an_address_bound_join_is_refused(certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=1, lease_ttl=1.0, check_interval=0.5) as ctl:
        assert ctl.server is not None and ctl.server.address_bound is None
        prov, epoch = await provisioner(certs, ctl)
        for fact in (
            intent("aws", epoch, refs=("i-ok",)),
            attrs.evolve(instance("aws", epoch, "i-ok"), address="127.0.0.1"),
        ):
            assert isinstance(await prov.request(FactCommit(fact)), FactAck)
        answer = await worker(certs, ctl, "m-i-ok")
        assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid"
        assert refusals(ctl.server) == {"address_bound_off": 1}


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_serve_reads_the_bootstrap_secret_from_a_0600_file_only(tmp_path: Path, mode: int, capsys: object) -> None:
    secret = tmp_path / "bootstrap"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, mode)
    assert AddressBoundJoin.from_file(secret) == AddressBoundJoin.from_secret(SECRET) if mode == 0o600 else True
    if mode == 0o644:
        argv = ["serve", "--certs", str(tmp_path), "--data", str(tmp_path / "d"), "--listen", "127.0.0.1:0"]
        assert main([*argv, "--address-bound-join", str(secret)]) == 2
        err = capsys.readouterr().err  # type: ignore[attr-defined]
        assert "mode 0644" in err and SECRET not in err
