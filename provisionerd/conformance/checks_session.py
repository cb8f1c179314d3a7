"""Rows about the session: join and version negotiation, redirects, the role allowlist, and refused frames.

Each function is one row: it returns the evidence of a pass, or raises ``CheckFailed`` (the evidence of a failure)
or ``NotRun`` (why it could not run).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable

import trio

from provisionerd.conformance.context import IDENTITY, Context
from provisionerd.conformance.peer import Peer, describe, join, join_primary
from provisionerd.conformance.results import CheckFailed, NotRun
from provisionerd.domain.model import PROTOCOL_VERSION, HostStatus, Role
from provisionerd.wire import codec
from provisionerd.wire.framing import frame_bytes
from provisionerd.wire.messages import (
    AdminStatus,
    ErrorMsg,
    FactAck,
    Heartbeat,
    HeartbeatAck,
    Join,
    JoinReply,
    LeaseAcquire,
    Message,
    WorkerStatus,
)


async def join_and_version(ctx: Context) -> str:
    peer, reply = await ctx.provisioner([ctx.provider("join")])
    problems = []
    if reply.protocol_version != PROTOCOL_VERSION:
        problems.append(f"protocolVersion {reply.protocol_version}, not {PROTOCOL_VERSION}")
    if not reply.primary or reply.term < 1:
        problems.append(f"primary={reply.primary} term={reply.term}")
    if not 1 <= len(reply.incarnation) <= 64 or not reply.incarnation.isprintable():
        problems.append(f"incarnation {reply.incarnation!r} is not 1..64 printable characters")
    ack = await peer.request(Heartbeat(1))
    if not (isinstance(ack, HeartbeatAck) and ack.seq == 1 and ack.term == reply.term):
        problems.append(f"heartbeat 1 answered {describe(ack)}")
    newer = Join(Role.PROVISIONER, IDENTITY, protocol_version=PROTOCOL_VERSION + 1, instance=ctx.instance)
    other, refused = await join(ctx.connector, peer.address, newer)
    closed = await other.closing(
        ctx.options.close_wait, f"the connection of the refused version-{PROTOCOL_VERSION + 1} Join"
    )
    await other.aclose()
    if not (isinstance(refused, ErrorMsg) and refused.code == "version_mismatch"):
        problems.append(f"a Join of version {PROTOCOL_VERSION + 1} answered {describe(refused)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"accepted at {peer.address}: term {reply.term}, incarnation {reply.incarnation!r}, lastIndex"
        f" {reply.last_index}; heartbeat acked; version {PROTOCOL_VERSION + 1} refused version_mismatch, {closed}"
    )


async def first_frame_not_join(ctx: Context) -> str:
    _, reply = await ctx.provisioner([ctx.provider("join")])  # finds the primary
    address = ctx.peers[-1].address
    peer = await ctx.connector.open(address, Role.PROVISIONER)
    try:
        corr = await peer.send(Heartbeat(1), corr=7)
        envelope = await peer.receive()
        closed = await peer.closing(ctx.options.close_wait, "the connection whose first frame was a heartbeat")
    finally:
        await peer.aclose()
    if envelope is None or not isinstance(envelope.msg, ErrorMsg) or envelope.msg.code != "not_joined":
        raise CheckFailed(f"a first frame heartbeat answered {describe(envelope.msg) if envelope else 'close'}")
    if envelope.corr != corr:
        raise CheckFailed(f"errorMsg not_joined carries corr {envelope.corr}, not the heartbeat's {corr}")
    return f"heartbeat as first frame: errorMsg not_joined (corr {corr} echoed), {closed}"


async def redirect_non_primary(ctx: Context) -> str:
    accepted, redirects, problems = [], [], []
    for address in ctx.addresses:
        peer, reply = await join(ctx.connector, address, ctx.join_msg([ctx.provider("join")]))
        await peer.aclose()
        if isinstance(reply, JoinReply) and reply.accepted:
            accepted.append(address)
        elif isinstance(reply, JoinReply) and not reply.primary and reply.redirect:
            redirects.append((address, reply))
        else:
            problems.append(f"{address}: {describe(reply)}")
    if len(accepted) != 1:
        problems.append(f"{len(accepted)} replicas accepted a provisioner ({', '.join(accepted) or 'none'}), not 1")
    for address, reply in redirects:
        if reply.reason != "not_primary":
            problems.append(f"{address}: redirect reason {reply.reason!r}, not 'not_primary'")
        peer, again = await join(ctx.connector, reply.redirect, ctx.join_msg([ctx.provider("join")]))
        await peer.aclose()
        if not (isinstance(again, JoinReply) and again.accepted):
            problems.append(f"{address} redirects to {reply.redirect}, which answered {describe(again)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{accepted[0]} accepted; " + "; ".join(f"{a} redirected to {r.redirect}" for a, r in redirects)


async def _refused(ctx: Context, peer: Peer, msg: Message) -> str:
    corr = await peer.send(msg)
    while True:  # pushes (corr 0, not an error) may come first
        try:
            envelope = await peer.receive(ctx.options.close_wait)
        except CheckFailed:
            raise CheckFailed(f"{codec.opcode(msg)} from a {peer.role.value}: no answer, still open") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            envelope = None  # the close overtook the errorMsg (a reset): refused all the same, but say so
        if envelope is None or envelope.corr != 0 or isinstance(envelope.msg, ErrorMsg):
            break
    if envelope is None:
        return f"{codec.opcode(msg)}: closed without errorMsg"
    if not (isinstance(envelope.msg, ErrorMsg) and envelope.msg.code == "not_allowed"):
        raise CheckFailed(f"{codec.opcode(msg)} from a {peer.role.value} answered {describe(envelope.msg)}")
    if envelope.corr != corr:
        raise CheckFailed(f"errorMsg not_allowed for {codec.opcode(msg)} carries corr {envelope.corr}, not {corr}")
    closed = await peer.closing(
        ctx.options.close_wait,
        f"the {peer.role.value} connection to {peer.address} after its refused {codec.opcode(msg)}",
    )
    return f"{codec.opcode(msg)}: errorMsg not_allowed, {closed}"


async def _joined(ctx: Context, role: Role, worker: tuple[str, str] | None) -> Peer:
    """A connection joined as ``role`` at the primary (a worker with ``worker``: its instance ref and token)."""
    if role is Role.PROVISIONER:
        return (await ctx.provisioner([ctx.provider("allow")]))[0]
    if role is Role.ADMIN:
        peer, _ = await join_primary(ctx.connector, ctx.addresses, Join(Role.ADMIN, IDENTITY))
    else:
        assert worker is not None
        msg = Join(Role.WORKER, IDENTITY, instance_ref=worker[0], token=worker[1])
        peer, _ = await join_primary(ctx.connector, ctx.addresses, msg)
    ctx.peers.append(peer)
    return peer


#: Per role, kinds it must not send (harmless if a broken controller answered them).
FORBIDDEN: dict[Role, tuple[Message, ...]] = {
    Role.PROVISIONER: (AdminStatus(), JoinReply(accepted=True), WorkerStatus(HostStatus.IDLE)),
    Role.WORKER: (LeaseAcquire("kit"), AdminStatus()),
    Role.ADMIN: (LeaseAcquire("kit"), FactAck(1)),
}


def allowlist(role: Role) -> Callable[[Context], Awaitable[str]]:
    async def check(ctx: Context) -> str:
        if not ctx.connector.has_role(role):
            raise NotRun(f"no {role.value} certificate in {ctx.connector.certs_dir}")
        said = []
        forbidden = FORBIDDEN[role]
        workers: list[tuple[str, str]] = []
        if role is Role.WORKER:  # a worker connection per frame, each with a token of this row's own
            tokens = await ctx.worker_tokens("allow-workers", len(forbidden))
            workers = list(zip(tokens.refs, tokens.tokens, strict=True))
        for i, msg in enumerate(forbidden):
            peer = await _joined(ctx, role, workers[i] if workers else None)
            try:
                said.append(await _refused(ctx, peer, msg))
            finally:
                await peer.aclose()
        return "; ".join(said)

    return check


async def join_role_matches_certificate(ctx: Context) -> str:
    said = []
    pairs = [(Role.PROVISIONER, Role.ADMIN), (Role.ADMIN, Role.PROVISIONER), (Role.WORKER, Role.PROVISIONER)]
    address = (await ctx.provisioner([ctx.provider("join")]))[0].address
    for cert, claimed in pairs:
        if not ctx.connector.has_role(cert):
            continue
        msg = Join(
            claimed,
            IDENTITY,
            providers=(ctx.provider("join"),) if claimed is Role.PROVISIONER else (),
            instance=ctx.instance if claimed is Role.PROVISIONER else "",
        )
        peer, reply = await join(ctx.connector, address, msg, cert)
        try:
            if not (isinstance(reply, ErrorMsg) and reply.code == "not_allowed"):
                raise CheckFailed(
                    f"a Join as {claimed.value} with a {cert.value} certificate answered {describe(reply)}"
                )
            said.append(f"{cert.value} certificate joining as {claimed.value}: errorMsg not_allowed")
        finally:
            await peer.aclose()
    if not said:
        raise NotRun("needs two role certificates")
    return "; ".join(said)


# --- frames ---------------------------------------------------------------------------------------------------


async def oversize_frame(ctx: Context) -> str:
    peer = (await ctx.provisioner([ctx.provider("frames")]))[0]
    length = ctx.options.max_frame + 8
    start = trio.current_time()
    await peer.framed.send_raw(struct.pack("<Q", length))  # the header only: a reader that waits for the body hangs
    closed = await peer.closing(ctx.options.close_wait, f"the connection that sent a header of {length} bytes")
    return f"header of {length} bytes (no body sent): {closed} after {trio.current_time() - start:.2f}s"


def _malformed() -> dict[str, bytes]:
    heartbeat = bytearray(codec.encode(Heartbeat(1), corr=9))
    unknown = bytearray(heartbeat)
    unknown[24:26] = (200).to_bytes(2, "little")  # Frame.body's discriminant: no member 200
    wild = bytearray(heartbeat)
    wild[32:40] = ((0x100000 << 2) | (1 << 32)).to_bytes(8, "little")  # the Heartbeat pointer far out of bounds
    return {
        "a zero-length body": b"",
        "a segment table of 1001 segments": struct.pack("<II", 1000, 0),
        "an unknown union member": bytes(unknown),
        "a pointer out of bounds": bytes(wild),
        "a body of 12 bytes": bytes(12),
    }


async def malformed_frames(ctx: Context) -> str:
    said = []
    for what, body in _malformed().items():
        peer = (await ctx.provisioner([ctx.provider("frames")]))[0]
        try:
            await peer.framed.send_raw(frame_bytes(body))
            try:
                said.append(f"{what}: {await peer.closing(ctx.options.close_wait, f'the connection that sent {what}')}")
            except CheckFailed as exc:
                raise CheckFailed(f"{what}: {exc}") from None
        finally:
            await peer.aclose()
    return "; ".join(said)
