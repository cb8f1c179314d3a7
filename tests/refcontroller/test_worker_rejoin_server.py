"""The server's side of the worker credential on in-memory streams and MockClock (protocol §4 "Worker credential").

A rejoin replaces a live session of the same instance only when it presents the current credential; anything else
is refused with ``errorMsg{tokenInvalid}``, counted by reason, and the live session keeps running.
"""

from __future__ import annotations

from pathlib import Path

import trio
from rc_client import Harness, Peer, memory_controller, on_mock_clock, seq_term
from rc_factories import instance, intent

from provisionerd.agent.token import rejoin_credential
from provisionerd.domain.model import HostStatus, Role
from provisionerd.wire.messages import (
    ErrorMsg,
    FactCommit,
    Heartbeat,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseGrant,
    Rejected,
)
from refcontroller.credentials import CREDENTIAL_PREFIX, new_credential

GRACE_END = 35.0


async def machines(h: Harness) -> Peer:
    prov, reply = await h.join(Role.PROVISIONER, "d1", providers=("aws",))
    assert isinstance(reply, JoinReply) and reply.accepted
    for _ in range(7):  # the grace a fresh controller imposes, heartbeating as a daemon does
        await trio.sleep(GRACE_END / 7)
        await prov.request(Heartbeat(0))
    grant = await prov.request(LeaseAcquire("aws"))
    assert isinstance(grant, LeaseGrant), grant
    await prov.request(FactCommit(intent("aws", grant.epoch, refs=("i-1", "i-2"))))
    await prov.request(FactCommit(instance("aws", grant.epoch, "i-1")))
    return prov


def refusals(h: Harness) -> dict[str, int]:
    return {reason: roles["worker"] for reason, roles in h.server.gate.status()["refusals"].items()}


@on_mock_clock
async def test_the_first_join_issues_a_credential_and_only_it_replaces_the_live_session(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        await machines(h)
        worker, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1")
        assert isinstance(reply, JoinReply) and reply.accepted
        mine = reply.credential
        assert mine.startswith(CREDENTIAL_PREFIX) and mine not in repr(reply)
        assert seq_term(await worker.request(Heartbeat(1))) == (1, 1)

        # The spent token, its rejoin proof and a credential that is not the current one: refused, counted, and
        # the live session is untouched.
        for secret in ("tok-i-1", rejoin_credential("tok-i-1", "i-1"), new_credential()):
            thief, answer = await h.join(Role.WORKER, "w1", instance_ref="i-1", token=secret)
            assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid", answer
            assert secret not in answer.message and await thief.closed()
        assert seq_term(await worker.request(Heartbeat(2))) == (2, 1)
        assert refusals(h) == {"token_invalid": 2, "credential_stale": 1}

        # The current credential is the proof that the old session is the same worker's: it replaces it.
        again, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token=mine)
        assert isinstance(reply, JoinReply) and reply.accepted and reply.credential == ""
        assert await worker.closed()
        assert seq_term(await again.request(Heartbeat(3))) == (3, 1)
        assert [s.join.instance_ref for s in h.server.sessions if s.role is Role.WORKER] == ["i-1"]


@on_mock_clock
async def test_a_lost_host_cannot_rejoin_with_its_credential(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, heartbeat=15.0) as h:
        prov = await machines(h)
        worker, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1")
        assert isinstance(reply, JoinReply) and reply.accepted
        await worker.framed.aclose()
        for _ in range(4):  # past the heartbeat timeout, the provisioner heartbeating
            await trio.sleep(5.0)
            await prov.request(Heartbeat(0))
        assert h.cluster.hosts.get("i-1").status is HostStatus.LOST
        late, answer = await h.join(Role.WORKER, "w1", instance_ref="i-1", token=reply.credential)
        assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid"
        assert h.cluster.store.credential("i-1").revoked == "lost"


@on_mock_clock
async def test_what_protocol_md_says_of_a_second_join_an_empty_identity_and_a_long_token(tmp_path: Path) -> None:
    """docs/protocol.md §4: the answers to a second Join, an empty identity and an over-long token."""
    async with memory_controller(tmp_path) as h:
        await machines(h)
        # An empty identity: refused with a reason, before the token is looked at (it is not spent).
        nameless, reply = await h.join(Role.WORKER, "", instance_ref="i-1", token="tok-i-1")
        assert isinstance(reply, JoinReply) and not reply.accepted and reply.primary
        assert reply.reason == "identity must be 1..256 characters" and await nameless.closed()
        assert h.cluster.store.credential("i-1") is None
        # A token over 1024 characters: tokenInvalid, whatever it holds.
        long, answer = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="x" * 1025)
        assert isinstance(answer, ErrorMsg) and answer.code == "token_invalid" and await long.closed()
        # A second Join on a joined connection: rejected{invalid, "already joined"}, the connection stays up with
        # the instance of its first Join (the second's token is not looked at: i-2's stays unspent).
        worker, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1")
        assert isinstance(reply, JoinReply) and reply.accepted
        again = await worker.request(Join(role=Role.WORKER, identity="w2", instance_ref="i-2", token="tok-i-2"))
        assert again == Rejected("invalid", "already joined")
        assert seq_term(await worker.request(Heartbeat(1))) == (1, 1)
        assert [s.join.instance_ref for s in h.server.sessions if s.role is Role.WORKER] == ["i-1"]
        assert h.cluster.store.credential("i-2") is None


@on_mock_clock
async def test_a_workers_capability_report_reaches_its_host_state_bounded(tmp_path: Path) -> None:
    """``Join.capabilities`` is carried into the host the provisioner sees (protocol §4 "Capabilities"): entries
    with sane keys and short printable values; the others are dropped, counted and logged (more than 8 entries is a
    frame over bounds, refused before it is read: ``wire.bounds``)."""
    async with memory_controller(tmp_path) as h:
        await machines(h)
        report = {"ncpus": "4", "mem": "7900", "type": "X86_64", "ngpus": "0", "bad key": "1", "long": "x" * 65}
        report |= {"extra0": "0", "extra1": "1"}
        worker, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1", capabilities=report)
        assert isinstance(reply, JoinReply) and reply.accepted
        host = h.server.cluster.hosts.get("i-1")
        assert host is not None
        assert dict(host.capabilities) == {
            "extra0": "0",
            "extra1": "1",
            "mem": "7900",
            "ncpus": "4",
            "ngpus": "0",
            "type": "X86_64",
        }
        assert h.server.stats["capabilities_dropped"] == 2
        (plan_host,) = [x for x in h.server.cluster.hosts.for_providers(["aws"]) if x.instance_ref == "i-1"]
        assert plan_host.capabilities == host.capabilities
