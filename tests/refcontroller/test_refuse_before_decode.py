"""The controller refuses a frame on its kind before decoding it: before the join only a Join, after it only the
role's allowlist. Every refusal is counted by reason and role in the status (memory streams, MockClock)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rc_client import Harness, Peer, memory_controller, on_mock_clock, seq_term
from rc_client import granted as lease
from rc_client import joined_provisioner as provisioner
from rc_factories import intent
from test_server_memory import GRACE_END, idle

from provisionerd.domain.model import Role
from provisionerd.testing.hostile_frames import LIST_FIELDS, list_bomb
from provisionerd.wire import codec, framing
from provisionerd.wire.framing import frame_bytes
from provisionerd.wire.messages import ErrorMsg, FactCommit, Heartbeat, Join, JoinReply
from provisionerd.wire.roles import ALLOWED


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds of client frames decoded (the server's ``FramedStream.decode`` is its only way to decode; the
    test's clients decode only what the controller sends, which is left out)."""
    kinds: list[str] = []
    real = framing.decode_metered

    def spy(body: bytes):  # type: ignore[no-untyped-def]
        head = codec.peek(body)
        if head.kind not in ALLOWED[Role.CONTROLLER]:
            kinds.append(head.member)
        return real(body)

    monkeypatch.setattr(framing, "decode_metered", spy)
    return kinds


def refusals(h: Harness) -> dict[str, dict[str, int]]:
    return h.server.status()["gate"]["refusals"]


@on_mock_clock
async def test_a_first_frame_other_than_join_is_refused_undecoded(tmp_path: Path, decoded: list[str]) -> None:
    async with memory_controller(tmp_path) as h:
        peer = Peer(h.open_stream(0, Role.WORKER))
        await peer.framed.send_raw(frame_bytes(list_bomb("adminSetDemand", ("items",))))
        envelope = await peer.receive_envelope()
        assert envelope.msg == ErrorMsg("not_joined", "the first frame must be Join")
        assert await peer.closed()
        assert decoded == []
        assert refusals(h) == {"not_joined": {"worker": 1}}


async def joined_worker(h: Harness, ref: str) -> Peer:
    """A worker joined with the token the provisioner's intent committed for ``ref`` (see ``rc_factories``)."""
    peer, reply = await h.join(Role.WORKER, ref, instance_ref=ref, token=f"tok-{ref}")
    assert isinstance(reply, JoinReply) and reply.accepted, reply
    return peer


@on_mock_clock
async def test_a_joined_worker_sending_any_list_bearing_frame_outside_its_allowlist_is_refused_undecoded(
    tmp_path: Path, decoded: list[str]
) -> None:
    outside = [(m, p) for m, p in LIST_FIELDS if codec._MESSAGE_BY_MEMBER[m] not in ALLOWED[Role.WORKER]]
    assert {m for m, _ in outside} == {m for m, _ in LIST_FIELDS} - {"join"}
    async with memory_controller(tmp_path) as h:
        prov = await provisioner(h)
        await idle(GRACE_END, prov)
        refs = tuple(f"i-{n}" for n in range(len(outside)))
        await prov.request(FactCommit(intent("aws", await lease(prov), refs=refs)))
        for ref, (member, path) in zip(refs, outside, strict=True):
            peer = await joined_worker(h, ref)
            decoded.clear()
            await peer.framed.send_raw(frame_bytes(list_bomb(member, path)))
            envelope = await peer.receive_envelope()
            assert envelope.msg == ErrorMsg("not_allowed", f"role worker may not send {member}")
            assert await peer.closed()
            assert decoded == [], (member, decoded)
        assert refusals(h) == {"not_allowed": {"worker": len(outside)}}
        assert seq_term(await prov.request(Heartbeat(1))) == (1, 1)


@on_mock_clock
async def test_a_worker_join_with_a_list_beyond_its_cap_is_refused_before_its_elements(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        peer = Peer(h.open_stream(0, Role.WORKER))
        await peer.framed.send_raw(frame_bytes(list_bomb("join", ("providers",), size=256 * 1024)))
        envelope = await peer.receive_envelope()
        # (The count is what fits beside the Join's other fields: it drops by one with each field added to Join.)
        assert envelope.msg.code == "bad_frame"
        assert re.fullmatch(r"Join\.providers holds 327\d\d elements, at most 1000 allowed", envelope.msg.message)
        # A Join larger than any legitimate one is refused on its size, before the rest of it is read.
        peer = Peer(h.open_stream(0, Role.WORKER))
        await peer.framed.send_raw(frame_bytes(list_bomb("join", ("providers",))))
        envelope = await peer.receive_envelope()
        assert envelope.msg.code == "bad_frame"
        assert envelope.msg.message == "a join frame of 1048576 bytes, at most 524288 allowed"
        assert refusals(h) == {"over_bounds": {"worker": 2}}


@on_mock_clock
async def test_refused_joins_are_counted_by_reason_and_role(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        _, reply = await h.join(Role.PROVISIONER, providers=("aws",), protocol_version=99)
        assert isinstance(reply, ErrorMsg) and reply.code == "version_mismatch"
        _, reply = await h.join(Role.WORKER, "w", instance_ref="i-9", token="not-issued")
        assert isinstance(reply, ErrorMsg) and reply.code == "token_invalid"
        _, reply = await h.join(Role.PROVISIONER, "", providers=("aws",))
        assert isinstance(reply, JoinReply) and not reply.accepted
        posing = Peer(h.open_stream(0, Role.ADMIN))
        reply = await posing.request(Join(role=Role.PROVISIONER, identity="posing", providers=("aws",)))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        assert refusals(h) == {
            "join_refused": {"provisioner": 1},
            "not_allowed": {"admin": 1},
            "token_invalid": {"worker": 1},
            "version_mismatch": {"provisioner": 1},
        }
