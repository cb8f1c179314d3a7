"""The admin socket's ``history`` command (``provisionerd history``): one page of the controller's fact log for this
daemon's providers, ended lifecycles included, read through the history query (docs/protocol.md §6.6).

Request: ``{"cmd": "history", "after": N, "until": M, "limit": K}`` (all optional, non-negative integers; ``until``
0 = the log's last index, fixed by the first page: send back the reply's ``until_index``). Reply: ``{"ok": true,
"facts": [{"index": i, "committed_at": t, "kind": "InstanceFact", ...the fact's fields}], "next_after",
"until_index", "done"}``; ``committed_at`` is when the controller committed the fact (epoch seconds, 0 when the
controller does not say: one older than the field). A bad field is refused with its reason; the controller's
refusal or a link that is down is the answer's ``error``.
"""

from __future__ import annotations

from typing import Any

import attrs

from provisionerd.controller.history import HistoryNotServed, history_page
from provisionerd.controller.session import ControllerSession
from provisionerd.daemon.admin_socket import Command
from provisionerd.domain.errors import ControllerRejected, LinkDown
from provisionerd.domain.model import CommittedFact

#: Bounds of the integer fields (the wire's UInt64 cursor; the page's own bound is the controller's).
MAX_INDEX = 2**63 - 1
MAX_LIMIT = 10_000


def fact_document(committed: CommittedFact) -> dict[str, Any]:
    """``{"index", "committed_at", "kind", ...fields}`` of a committed fact, JSON-ready (tuples become lists)."""
    fact = committed.fact
    head = {"index": committed.index, "committed_at": committed.committed_at, "kind": type(fact).__name__}
    return {**head, **attrs.asdict(fact)}


def _field(request: dict[str, Any], name: str, top: int) -> int:
    value = request.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ValueError(f"{name} must be an integer from 0 to {top}")
    return value


def history_command(session: ControllerSession) -> Command:
    async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
        try:
            after, until = _field(request, "after", MAX_INDEX), _field(request, "until", MAX_INDEX)
            limit = _field(request, "limit", MAX_LIMIT)
        except ValueError as exc:
            return {"ok": False, "error": str(exc)}
        try:
            page = await history_page(session, after=after, until=until, max_facts=limit)
        except (LinkDown, ControllerRejected, HistoryNotServed) as exc:  # HistoryUnreadable is a LinkDown
            return {"ok": False, "error": f"cannot read the controller's history: {exc}"}
        return {
            "ok": True,
            "facts": [fact_document(c) for c in page.facts],
            "next_after": page.next_after,
            "until_index": page.until_index,
            "done": page.done,
        }

    return Command(run=run, timeout=lambda _request: 15.0)
