"""The daemon's reader of the controller's history query (docs/protocol.md §6.6): the fact log a page at a time.

The resync gives live state only; the history holds every fact of our providers, ended lifecycles included.
``history_pages`` asks for pages over the session's link (as the provisioner: only the providers its Join
declared), the first page fixing the log's upper bound so the pages make one consistent read of a fixed log, and
yields each page as it comes (a checkpoint between pages: the loop is never held longer than one page's decode).
``MAX_PAGES`` bounds one read, so a controller that never says ``done`` cannot keep it going.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import trio

from provisionerd.controller.session import ControllerSession
from provisionerd.domain.errors import LinkDown, ProvisionerdError
from provisionerd.domain.model import CommittedFact
from provisionerd.wire.messages import HistoryPage, HistoryQuery

#: Pages one read asks for at most: 500 facts each, 100 million facts in all.
MAX_PAGES = 200_000


class HistoryUnreadable(LinkDown):
    """The controller's answers to the history query make no sense (a cursor that does not move, a reply of
    another kind, no end): the read is abandoned."""


class HistoryNotServed(ProvisionerdError):
    """The controller this session joined did not announce the history query (``JoinReply.history`` false: an
    older controller, which would close the link on one): nothing was sent."""


async def history_page(
    session: ControllerSession, providers: Sequence[str] = (), *, after: int = 0, until: int = 0, max_facts: int = 0
) -> HistoryPage:
    """One page of ``providers``' facts (empty: all this connection declared) after ``after`` up to ``until`` (0:
    the log's last index), checked: a page that goes back or holds facts outside its range is ``HistoryUnreadable``.

    Raises:
        LinkDown: the link is not up or broke (the read may be tried again).
        ControllerRejected: the controller refused the query (``invalid``: a provider it may not read).
        HistoryUnreadable: the answer is not a page, or not a page of what was asked.
        HistoryNotServed: the joined controller does not answer the query (nothing sent; the link stays up).
    """
    if session.generation and not session.controller_history:
        raise HistoryNotServed(
            "the controller does not serve the history query (JoinReply.history is false: an older controller)"
        )
    reply = await session.request(HistoryQuery(tuple(providers), after, until, max_facts))
    if not isinstance(reply, HistoryPage):
        raise HistoryUnreadable(f"expected HistoryPage, the controller sent {type(reply).__name__}")
    if reply.next_after < after or (until and reply.until_index > until):
        raise HistoryUnreadable(f"the history cursor went back ({after} -> {reply.next_after})")
    if any(c.index <= after or c.index > reply.until_index for c in reply.facts):
        raise HistoryUnreadable("a history page holds facts outside the range it was asked for")
    return reply


async def history_pages(
    session: ControllerSession,
    providers: Sequence[str] = (),
    *,
    after: int = 0,
    until: int = 0,
    max_facts: int = 0,
    max_pages: int = MAX_PAGES,
) -> AsyncIterator[HistoryPage]:
    """Every page (``history_page``) of ``providers``' facts after ``after`` up to ``until`` (0: the log's last index
    when the first page is read), in log order. Raises as ``history_page`` does, and ``HistoryUnreadable`` when
    the cursor does not move on a page that is not the last, or after ``max_pages`` pages."""
    for _ in range(max_pages):
        reply = await history_page(session, providers, after=after, until=until, max_facts=max_facts)
        yield reply
        if reply.done:
            return
        if reply.next_after == after:
            raise HistoryUnreadable(f"the history cursor does not move (at {after}) and the page is not the last")
        after, until = reply.next_after, reply.until_index
        await trio.lowlevel.checkpoint()
    raise HistoryUnreadable(f"the history did not end within {max_pages} pages")


#: Facts one backward read (``recent_facts``) asks for per step, and at most in all.
RECENT_CHUNK = 2_000
RECENT_MAX = 50_000


async def recent_facts(
    session: ControllerSession,
    providers: Sequence[str],
    since: float,
    last_index: int,
    *,
    chunk: int = RECENT_CHUNK,
    max_facts: int = RECENT_MAX,
) -> list[CommittedFact]:
    """``providers``' facts committed at or after wall time ``since`` (``CommittedFact.committed_at``), up to log
    index ``last_index``, in log order: read backwards ``chunk`` indexes at a time (each step through
    ``history_pages``) until a step reaches a fact older than ``since``, the start of the log, or ``max_facts``
    facts (bounded work: the oldest of a longer span are left out). A fact with no time (0: an older controller) is
    kept, and does not end the read by itself. Raises as ``history_page`` does."""
    found: list[list[CommittedFact]] = []
    count, upper = 0, last_index
    while upper > 0 and count < max_facts:
        lower = max(0, upper - chunk)
        step: list[CommittedFact] = []
        async for page in history_pages(session, providers, after=lower, until=upper):
            step.extend(page.facts)
        found.append(step)
        count += len(step)
        if any(0 < c.committed_at < since for c in step):
            break
        upper = lower
    return [c for step in reversed(found) for c in step if not 0 < c.committed_at < since]
