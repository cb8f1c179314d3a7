"""The admin client: one TLS connection per call, joined with the admin certificate, following redirects.

Used by ``refcontroller admin`` and by the Python test API. A connection per call keeps it simple and correct
across failovers (the controller disconnects every client of the old primary). Every call returns the parsed JSON
of the ``AdminReply``; a reply with ``ok = false`` raises ``AdminError`` with the controller's message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from provisionerd.domain.errors import ProtocolError, ProvisionerdError
from provisionerd.domain.model import DemandItem, LicenseUse, Role
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import (
    AdminFailover,
    AdminQuorum,
    AdminReply,
    AdminSetDemand,
    AdminStatus,
    Envelope,
    ErrorMsg,
    HistoryPage,
    HistoryQuery,
    Join,
    JoinReply,
    Message,
)
from provisionerd.wire.tls import client_ssl_context
from refcontroller import addresses as addr

log = logging.getLogger(__name__)

MAX_REDIRECTS = 3


class AdminError(ProvisionerdError):
    """The controller could not be reached, refused the admin, or answered ``ok = false``."""


class AdminClient:
    def __init__(self, certs_dir: Path | str, addresses: Sequence[str], *, timeout: float = 10.0) -> None:
        if not addresses:
            raise ValueError("an admin client needs at least one controller address")
        self.addresses = list(addresses)
        self.timeout = timeout
        self._ssl = client_ssl_context(Path(certs_dir), Role.ADMIN)

    async def set_demand(self, items: Sequence[DemandItem], licenses: Sequence[LicenseUse] = ()) -> dict[str, Any]:
        """Replace the demand (and the licence use it carries); ``{"seq": n, "changed": bool}``."""
        return await self.call(AdminSetDemand(tuple(items), tuple(licenses)))

    async def fail_over(self, target: int | None = None) -> dict[str, Any]:
        """Promote ``target`` (default: the next replica); ``{"primary": i, "term": t, "previous": j}``."""
        return await self.call(AdminFailover(-1 if target is None else target))

    async def set_quorum(self, fresh: bool) -> dict[str, Any]:
        return await self.call(AdminQuorum(fresh))

    async def status(self) -> dict[str, Any]:
        return await self.call(AdminStatus())

    async def history(self, query: HistoryQuery) -> HistoryPage:
        """One page of the fact log, ended lifecycles included (protocol §6.6); ``AdminError`` on a refusal."""
        envelope = await self._exchange(query)
        if envelope is None or not isinstance(envelope.msg, HistoryPage):
            raise AdminError(f"unexpected answer to HistoryQuery: {envelope!r}")
        return envelope.msg

    async def _exchange(self, msg: Message) -> Envelope | None:
        with trio.fail_after(self.timeout):
            framed = await self._connect_to_primary()
            try:
                await framed.send(msg, 2)
                return await framed.receive()
            finally:
                with trio.move_on_after(1.0):  # a clean TLS close; forceful if the controller is gone
                    await framed.stream.aclose()

    async def call(self, msg: Message) -> dict[str, Any]:
        envelope = await self._exchange(msg)
        if envelope is None or not isinstance(envelope.msg, AdminReply):
            raise AdminError(f"unexpected answer to {type(msg).__name__}: {envelope!r}")
        document = json.loads(envelope.msg.json) if envelope.msg.json else {}
        if not envelope.msg.ok:
            raise AdminError(f"controller refused {type(msg).__name__}: {document.get('error', document)}")
        return document

    async def _connect_to_primary(self) -> FramedStream:
        problems: list[str] = []
        for address in self.addresses:
            target = address
            for _ in range(MAX_REDIRECTS + 1):
                try:
                    framed, redirect = await self._join(target)
                except (OSError, trio.BrokenResourceError, ProtocolError) as exc:
                    problems.append(f"{target}: {exc}")
                    break
                if framed is not None:
                    return framed
                if not redirect:
                    problems.append(f"{target}: refused without a redirect")
                    break
                target = redirect
        raise AdminError("no controller primary reachable: " + "; ".join(problems))

    async def _join(self, address: str) -> tuple[FramedStream | None, str]:
        host, port = addr.parse(address)
        stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=self._ssl)
        framed = FramedStream(stream)
        try:
            await framed.send(Join(role=Role.ADMIN, identity="refcontroller-admin"), 1)
            envelope = await framed.receive()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        reply = None if envelope is None else envelope.msg
        if isinstance(reply, JoinReply) and reply.accepted:
            return framed, ""
        await trio.aclose_forcefully(stream)
        if isinstance(reply, JoinReply):
            return None, reply.redirect
        if isinstance(reply, ErrorMsg):
            raise AdminError(f"{address} refused the admin: {reply.code}: {reply.message}")
        raise AdminError(f"{address} closed the connection during the join")
