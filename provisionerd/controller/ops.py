"""Lease operations and fact commits over the controller session: the real ``LeaseTransport`` and ``FactCommitter``.

Translates between the wire messages and what the lease keeper and the mutation gate speak. A reply of the wrong
kind is a protocol violation: the link is broken (the session rejoins) and the caller gets ``LinkDown``.
"""

from __future__ import annotations

import logging

import trio

from provisionerd.controller.lease import LeaseGranted, LeaseRefused, LeaseReply
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import LinkState
from provisionerd.domain.errors import ControllerRejected, LinkDown
from provisionerd.domain.model import CommittedFact, DrainRequested, Epoch, Fact
from provisionerd.wire.messages import (
    Ack,
    FactAck,
    FactCommit,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Message,
)

log = logging.getLogger(__name__)


class ControllerOps:
    def __init__(self, session: ControllerSession) -> None:
        self._session = session
        #: ``DrainRequested`` facts not sent to a controller that does not know them.
        self.drains_refused = 0

    async def wait_ready(self) -> None:
        await self._session.wait_ready()

    def _unexpected(self, reply: Message, wanted: str) -> LinkDown:
        reason = f"expected {wanted}, the controller sent {type(reply).__name__}"
        self._session.break_link(reason)
        return LinkDown(reason)

    def _lease_reply(self, provider: str, reply: Message) -> LeaseReply:
        if isinstance(reply, LeaseGrant) and reply.provider == provider:
            return LeaseGranted(reply.epoch, reply.ttl_ms / 1000.0)
        if isinstance(reply, LeaseDenied) and reply.provider == provider:
            return LeaseRefused(reply.reason, reply.retry_after_ms / 1000.0)
        raise self._unexpected(reply, f"LeaseGrant or LeaseDenied for {provider!r}")

    async def acquire(self, provider: str) -> LeaseReply:
        """Ask for ``provider``'s lease. A grant (never a renewal) registers a resync sent after it
        (``session.resync_after_grant``): facts another holder committed are never pushed to us, so nothing is
        planned for the provider from the view until that resync is in (``synced_for``)."""
        try:
            reply = self._lease_reply(provider, await self._session.request(LeaseAcquire(provider)))
        except ControllerRejected as exc:
            return LeaseRefused(exc.reason)
        if isinstance(reply, LeaseGranted):
            self._session.resync_after_grant(provider)
        return reply

    async def renew(self, provider: str, epoch: Epoch) -> LeaseReply:
        try:
            return self._lease_reply(provider, await self._session.request(LeaseRenew(provider, epoch)))
        except ControllerRejected as exc:
            return LeaseRefused(exc.reason)

    async def release(self, provider: str, epoch: Epoch) -> None:
        try:
            reply = await self._session.request(LeaseRelease(provider, epoch))
        except ControllerRejected:
            return  # not ours any more: nothing to give back
        if not isinstance(reply, Ack):
            raise self._unexpected(reply, "Ack")

    async def commit(self, fact: Fact) -> int:
        """Commit ``fact``; its index once the primary acknowledged it. Waits (bounded) for a resynced link.

        A ``DrainRequested`` is refused here (``ControllerRejected("invalid")``, nothing sent) when the controller
        did not announce ``JoinReply.drains``: an older one could not decode it and would close the link. The drain
        then lives in the daemon alone (``planner.drain``: the machine still goes at its drain timeout)."""
        if self._session.state is not LinkState.UP:
            with trio.move_on_after(self._session.settings.request_timeout):
                await self._session.wait_ready()
        if isinstance(fact, DrainRequested) and not self._session.controller_drains:
            self.drains_refused += 1
            log.info("DrainRequested %s not sent: the controller does not know it (older than drains)", fact.op_id)
            raise ControllerRejected("invalid", "the controller does not know DrainRequested (JoinReply.drains)")
        try:
            reply = await self._session.request(FactCommit(fact))
        except LinkDown:
            # It may be committed all the same (on its way when the link broke): a later resync looks (commit_doubt).
            self._session.commit_doubt.doubt(trio.current_time(), 2 * self._session.settings.request_timeout)
            raise
        if not isinstance(reply, FactAck):
            raise self._unexpected(reply, "FactAck")
        self._session.note_committed(CommittedFact(reply.index, fact, reply.committed_at))
        return reply.index
