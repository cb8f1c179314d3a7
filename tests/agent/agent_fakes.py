"""An in-memory controller for the agent's trio-shell tests (MockClock): replicas, redirects, tokens, rejoin.

It implements the worker side of docs/protocol.md plus the rejoin rule of provisionerd/agent_token.py: a token admits
once, and afterwards ``sha256(rejoin proof)`` (recorded at that first admission) admits the same instance again.
"""

from __future__ import annotations

import hashlib

import attrs
import trio
import trio.testing

from provisionerd.agent.token import rejoin_hash, rejoin_hash_of_credential
from provisionerd.domain.model import HostStatus
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import Ack, ErrorMsg, Heartbeat, HeartbeatAck, Join, JoinReply, WorkerStatus


@attrs.define(eq=False)
class FakeController:
    nursery: trio.Nursery
    addresses: tuple[str, ...]
    primary: int = 0
    term: int = 1
    down: set[str] = attrs.field(factory=set)
    hang_joins: bool = False  # take the Join and never answer it
    mute: bool = False  # joined sessions stop answering heartbeats (a hung controller)
    rejoin_supported: bool = True
    token_hashes: dict[str, str] = attrs.field(factory=dict)  # sha256(token) -> instance_ref
    used: set[str] = attrs.field(factory=set)
    rejoin_hashes: dict[str, str] = attrs.field(factory=dict)  # instance_ref -> sha256(proof)
    # (virtual time, address, what): "connect", "join:token", "join:proof", "refused", "redirect"
    log: list[tuple[float, str, str]] = attrs.field(factory=list)
    statuses: list[tuple[float, HostStatus]] = attrs.field(factory=list)
    reports: list[tuple[float, WorkerStatus]] = attrs.field(factory=list)  # every WorkerStatus, notices included
    heartbeats: list[float] = attrs.field(factory=list)
    close_after_accept: bool = False  # accept the join, then close at once (a controller in trouble)
    drop_after_join_frame: bool = False  # consume the join, then close without answering (once)
    issue_credentials: bool = False  # answer a token join with a per-instance credential (refcontroller/credentials)
    credentials: dict[str, str] = attrs.field(factory=dict)  # instance_ref -> its current credential
    received: list[Join] = attrs.field(factory=list)  # every Join, as it arrived
    _sessions: list[trio.CancelScope] = attrs.field(factory=list)

    def allow(self, instance_ref: str, token: str) -> None:
        self.token_hashes[hashlib.sha256(token.encode()).hexdigest()] = instance_ref

    async def connect(self, address: str) -> trio.abc.Stream:
        self.log.append((trio.current_time(), address, "connect"))
        if address in self.down or address not in self.addresses:
            raise OSError(f"connection refused: {address}")
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, server, self.addresses.index(address), address)
        return client

    def fail_over(self) -> None:
        """The next replica becomes primary in a new term; every open session is closed."""
        self.primary = (self.primary + 1) % len(self.addresses)
        self.term += 1
        for scope in self._sessions:
            scope.cancel()

    def _admit(self, join: Join) -> str | None:
        """None if admitted, else the refusal's message."""
        digest = hashlib.sha256(join.token.encode()).hexdigest()
        if self.token_hashes.get(digest) == join.instance_ref and digest not in self.used:
            self.used.add(digest)
            if self.issue_credentials:
                self.credentials[join.instance_ref] = f"cred-v1:{join.instance_ref}-{len(self.used)}"
            else:
                self.rejoin_hashes[join.instance_ref] = rejoin_hash(join.token, join.instance_ref)
            return None
        if join.token.startswith("cred-v1:"):
            return None if self.credentials.get(join.instance_ref) == join.token else "credential refused"
        proof = rejoin_hash_of_credential(join.token)
        if proof is not None and self.rejoin_supported and self.rejoin_hashes.get(join.instance_ref) == proof:
            return None
        return "token refused"

    async def _serve(self, stream: trio.abc.Stream, replica: int, address: str) -> None:
        framed = FramedStream(stream)
        with trio.CancelScope() as scope:
            self._sessions.append(scope)
            try:
                await self._session(framed, replica, address)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await trio.aclose_forcefully(stream)

    async def _session(self, framed: FramedStream, replica: int, address: str) -> None:
        envelope = await framed.receive()
        if envelope is None or self.hang_joins:
            await trio.sleep_forever()
        join = envelope.msg
        assert isinstance(join, Join)
        self.received.append(join)
        kind = {"rejoin-v1:": "proof", "cred-v1:": "credential"}.get(join.token.partition(":")[0] + ":", "token")
        self.log.append((trio.current_time(), address, f"join:{kind}"))
        if replica != self.primary:
            self.log.append((trio.current_time(), address, "redirect"))
            reply = JoinReply(False, self.term, primary=False, redirect=self.addresses[self.primary])
            await framed.send(reply, envelope.corr)
            return
        refusal = self._admit(join)
        if self.drop_after_join_frame:
            self.drop_after_join_frame = False
            return
        if refusal is not None:
            self.log.append((trio.current_time(), address, "refused"))
            await framed.send(ErrorMsg("token_invalid", refusal), envelope.corr)
            return
        issued = self.credentials.get(join.instance_ref, "") if kind == "token" else ""
        reply = JoinReply(True, self.term, primary=True, controller_id=f"replica-{replica}", credential=issued)
        await framed.send(reply, envelope.corr)
        if self.close_after_accept:
            return
        while (envelope := await framed.receive()) is not None:
            match envelope.msg:
                case Heartbeat(seq=seq):
                    self.heartbeats.append(trio.current_time())
                    if not self.mute:
                        await framed.send(HeartbeatAck(seq, self.term), envelope.corr)
                case WorkerStatus(status=status):
                    self.statuses.append((trio.current_time(), status))
                    self.reports.append((trio.current_time(), envelope.msg))
                    await framed.send(Ack(), envelope.corr)
