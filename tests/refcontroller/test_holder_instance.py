"""A lease holder is a process (``Join.identity`` + ``Join.instance``), not a configured identity.

Two daemons started from the same config (same identity) on two hosts must never both be told they hold a
provider's lease. On the server over in-memory streams and MockClock: promoted at t=0, ttl 30 s, check 5 s, so the
first grace ends at t=35 (see test_server_memory.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from rc_client import Harness, Peer, granted, joined_provisioner, memory_controller, on_mock_clock
from rc_factories import instance, intent

from provisionerd.domain.model import Epoch, Role
from provisionerd.wire.messages import (
    Ack,
    AdminFailover,
    AdminStatus,
    FactAck,
    FactCommit,
    JoinReply,
    LeaseAcquire,
    LeaseDenied,
    LeaseRelease,
    LeaseRenew,
    Rejected,
)
from refcontroller.leases import MAX_INSTANCE, holder_key, instance_problem

GRACE_END = 35.0
TTL = 30.0


async def daemon(h: Harness, instance: str, identity: str = "prov", replica: int = 0) -> Peer:
    """A provisioner process joined with ``instance`` (after its demand snapshot)."""
    return await joined_provisioner(h, identity, replica, instance=instance)


async def denied(peer: Peer, reason: str, provider: str = "aws") -> LeaseDenied:
    reply = await peer.request(LeaseAcquire(provider))
    assert isinstance(reply, LeaseDenied) and reply.reason == reason, reply
    return reply


async def status(h: Harness) -> dict:
    admin, _ = await h.join(Role.ADMIN, "ops")
    reply = await admin.request(AdminStatus())
    return json.loads(reply.json)


def test_the_holder_key():
    assert holder_key("prov", "9f3c") == "prov#9f3c"
    assert holder_key("prov", "") == "prov"  # an older client: its identity, as before
    assert instance_problem("prov", "") is None and instance_problem("prov", "x" * MAX_INSTANCE) is None
    assert instance_problem("p#1", "abc") is None  # the last '#' separates: the instance has none
    for bad in ("x" * (MAX_INSTANCE + 1), "a#b", "tab\there", "new\nline"):
        assert instance_problem("prov", bad), bad
    # "p#1" without an instance would be the same key as identity "p", instance "1".
    assert instance_problem("p#1", "")


@on_mock_clock
async def test_two_processes_with_one_identity_are_two_holders(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        first, twin = await daemon(h, "i1"), await daemon(h, "i2")
        await trio.sleep(GRACE_END)
        epoch = await granted(first)
        await trio.sleep(10)
        held = await denied(twin, "held")
        assert held.retry_after_ms == 20_000  # until the first's lease expires (granted at 35, ttl 30)
        # The twin cannot use, renew or release the first's epoch, although its identity is the same.
        reply = await twin.request(FactCommit(intent("aws", epoch)))
        assert isinstance(reply, Rejected) and reply.reason == "no_lease", reply
        reply = await twin.request(LeaseRenew("aws", epoch))
        assert isinstance(reply, LeaseDenied) and reply.reason == "held", reply
        reply = await twin.request(LeaseRelease("aws", epoch))
        assert isinstance(reply, Rejected) and reply.reason == "stale_epoch", reply
        assert await first.request(FactCommit(intent("aws", epoch))) == FactAck(1, GRACE_END + 10)  # wall: mock
        # The facts, the durable grantee and the admin status all name the process.
        assert h.cluster.store.latest("aws").holder == "prov#i1"
        assert h.cluster.store.last_grantee("aws") == "prov#i1"
        doc = await status(h)
        assert [(lease["provider"], lease["holder"]) for lease in doc["leases"]] == [("aws", "prov#i1")]
        assert {(s["identity"], s.get("instance")) for s in doc["sessions"] if s["role"] == "provisioner"} == {
            ("prov", "i1"),
            ("prov", "i2"),
        }
        assert h.server.stats["internal_errors"] == 0


@on_mock_clock
async def test_a_rejoin_of_the_same_process_keeps_its_epoch(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        first = await daemon(h, "i1")
        await trio.sleep(GRACE_END)
        epoch = await granted(first)
        await first.framed.aclose()  # the link broke; the process lives on with its instance
        await trio.sleep(5)
        again = await daemon(h, "i1")
        assert await granted(again) == epoch  # idempotent re-acquire: the same epoch, renewed
        assert await again.request(FactCommit(intent("aws", epoch))) == FactAck(1, GRACE_END + 5)


@on_mock_clock
async def test_a_restarted_process_waits_for_its_previous_lease(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        crashed = await daemon(h, "i1")
        await trio.sleep(GRACE_END)
        old = await granted(crashed)
        await trio.sleep(12)
        await crashed.framed.aclose()  # killed: no release
        restarted = await daemon(h, "i2")
        wait = (await denied(restarted, "held")).retry_after_ms
        assert wait == 18_000  # granted at 35 + ttl 30 = 65; now 47
        await trio.sleep(wait / 1000)
        new = await granted(restarted)
        assert new > old and trio.current_time() == GRACE_END + TTL
        assert h.cluster.store.last_grantee("aws") == "prov#i2"
        # A clean stop gives the lease back, so the next start gets it at once.
        assert await restarted.request(LeaseRelease("aws", new)) == Ack()
        await restarted.framed.aclose()
        clean = await daemon(h, "i3")
        assert await granted(clean) > new


@on_mock_clock
async def test_after_failover_the_grace_regrants_only_the_last_grantee_process(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        a1, a2 = await daemon(h, "i1"), await daemon(h, "i2")
        await trio.sleep(GRACE_END)
        e1 = await granted(a1)
        assert await a1.request(FactCommit(intent("aws", e1))) == FactAck(1, GRACE_END)
        assert await a1.request(LeaseRelease("aws", e1)) == Ack()
        e2 = await granted(a2)  # the last grantee: a2, although a1 wrote the latest fact
        admin, _ = await h.join(Role.ADMIN, "ops")
        assert (await admin.request(AdminFailover(1))).ok
        assert await a1.closed() and await a2.closed()
        # Everyone of identity "prov" rejoins the new primary; only the process that holds e2 gets it back now.
        a1, a2, a3 = [await daemon(h, i, replica=1) for i in ("i1", "i2", "i3")]
        grace = await denied(a1, "grace")
        assert grace.retry_after_ms == 35_000
        await denied(a3, "grace")  # a fresh start of "prov" cannot know what i2 believes either
        e3 = await granted(a2)
        assert e3 == Epoch(2, 1) and e3 > e2
        reply = await a1.request(FactCommit(instance("aws", e3, "i-1")))
        assert isinstance(reply, Rejected) and reply.reason == "no_lease"
        now = trio.current_time()
        assert await a2.request(FactCommit(instance("aws", e3, "i-1"))) == FactAck(2, now)
        assert h.cluster.store.latest("aws").holder == "prov#i2"


@on_mock_clock
async def test_an_old_client_without_instance_is_its_identity(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        old = await daemon(h, "")
        new = await daemon(h, "i1")
        await trio.sleep(GRACE_END)
        epoch = await granted(old)
        await denied(new, "held")
        assert h.cluster.store.last_grantee("aws") == "prov"
        assert await old.request(FactCommit(intent("aws", epoch))) == FactAck(1, GRACE_END)
        assert (await status(h))["leases"][0]["holder"] == "prov"


@pytest.mark.parametrize(
    ("identity", "bad_instance"),
    [("prov", "x" * (MAX_INSTANCE + 1)), ("prov", "a#b"), ("prov", "line\nbreak"), ("prov#1", "")],
    ids=["too-long", "hash", "unprintable", "hash-identity-without-instance"],
)
@on_mock_clock
async def test_a_bad_instance_is_refused_at_join(tmp_path: Path, identity: str, bad_instance: str) -> None:
    async with memory_controller(tmp_path) as h:
        peer, reply = await h.join(Role.PROVISIONER, identity, providers=("aws",), instance=bad_instance)
        assert isinstance(reply, JoinReply) and not reply.accepted and reply.primary, reply
        assert "instance" in reply.reason
        assert await peer.closed()
        assert not h.server.sessions and h.server.stats["internal_errors"] == 0
        ok = await daemon(h, "x" * MAX_INSTANCE, identity="prov#1")  # 64 characters, '#' only in the identity
        await trio.sleep(GRACE_END)
        await granted(ok)
        assert h.cluster.store.last_grantee("aws") == "prov#1#" + "x" * MAX_INSTANCE
