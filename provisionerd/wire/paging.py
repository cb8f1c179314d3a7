"""Pure helpers that cut large state into pages so that no frame approaches the frame limit.

A page is bounded twice: by item count (``max_items``) and by its encoded size (``max_bytes``, default
``PAGE_BYTES`` = 256 KiB, a quarter of the default 1 MiB frame limit). The byte bound is exact, not an estimate:
a page that encodes too large is split in half until it fits, so items of any size mix safely. The page numbers
live in fixed-size fields, so numbering pages after the split does not change their size.

A single item that cannot fit in ``max_bytes`` on its own raises ``ValueError``: it should have been refused where
it entered (an ``AdminSetDemand`` frame is itself bounded by the frame limit, and a page budget of a quarter of it
leaves room for any item that arrived in a frame).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from provisionerd.domain.model import CommittedFact, DemandItem, HostState, LicenseUse
from provisionerd.wire.codec import encode
from provisionerd.wire.messages import DemandPage, HostStatePush, Message, ResyncPage

T = TypeVar("T")

PAGE_BYTES = 256 * 1024
#: Default item caps per page. At typical sizes (a demand item or fact is 100-300 bytes) the byte bound does not
#: bite; the count cap keeps pages small enough that one page costs well under a millisecond to build or fold.
DEMAND_PAGE_ITEMS = 500
RESYNC_PAGE_ITEMS = 500
HOSTS_PAGE_ITEMS = 500


def paginate(items: Sequence[T], max_items: int) -> list[tuple[T, ...]]:
    """``items`` in order, in chunks of at most ``max_items``. Always at least one page (empty state = ``[()]``)."""
    if max_items < 1:
        raise ValueError(f"max_items must be at least 1, not {max_items!r}")
    pages = [tuple(items[i : i + max_items]) for i in range(0, len(items), max_items)]
    return pages or [()]


def paginate_by_size(
    items: Sequence[T], make: Callable[[tuple[T, ...]], Message], max_items: int, max_bytes: int = PAGE_BYTES
) -> list[tuple[T, ...]]:
    """Like ``paginate``, and additionally every ``make(page)`` encodes to at most ``max_bytes``."""
    out: list[tuple[T, ...]] = []
    pending = paginate(items, max_items)[::-1]
    while pending:
        page = pending.pop()
        size = len(encode(make(page)))
        if size <= max_bytes:
            out.append(page)
            continue
        if len(page) <= 1:
            raise ValueError(f"a page of {len(page)} item(s) encodes to {size} bytes, above {max_bytes}")
        half = len(page) // 2
        pending += [page[half:], page[:half]]  # the stack pops the first half first
    return out


def demand_pages(
    snapshot_seq: int,
    items: Sequence[DemandItem],
    max_items: int = DEMAND_PAGE_ITEMS,
    max_bytes: int = PAGE_BYTES,
    licenses: Sequence[LicenseUse] = (),
) -> list[DemandPage]:
    """One demand snapshot as its pages, ``page`` 0..n-1 of ``page_count`` n. No demand is one empty page. Page 0
    carries the snapshot's ``licenses`` (a few per pool: they fit in the room a page leaves)."""
    chunks = paginate_by_size(items, lambda c: DemandPage(snapshot_seq, 0, 1, c), max_items, max_bytes)
    return [
        DemandPage(snapshot_seq, i, len(chunks), chunk, tuple(licenses) if i == 0 else ())
        for i, chunk in enumerate(chunks)
    ]


def resync_pages(
    facts: Sequence[CommittedFact],
    hosts: Sequence[HostState],
    max_items: int = RESYNC_PAGE_ITEMS,
    max_bytes: int = PAGE_BYTES,
) -> list[ResyncPage]:
    """The facts (in log order) then the hosts, spread over pages; a page may hold some of each."""
    both: list[CommittedFact | HostState] = [*facts, *hosts]

    def make(chunk: tuple[CommittedFact | HostState, ...]) -> ResyncPage:
        return ResyncPage(
            0,
            1,
            [x for x in chunk if isinstance(x, CommittedFact)],
            [x for x in chunk if isinstance(x, HostState)],
        )

    chunks = paginate_by_size(both, make, max_items, max_bytes)
    return [
        ResyncPage(i, len(chunks), page.facts, page.hosts) for i, page in enumerate(make(chunk) for chunk in chunks)
    ]


def host_pushes(
    hosts: Sequence[HostState], max_items: int = HOSTS_PAGE_ITEMS, max_bytes: int = PAGE_BYTES
) -> list[HostStatePush]:
    """Host changes as one or more pushes (each push is a delta, so they need no numbering)."""
    return [HostStatePush(chunk) for chunk in paginate_by_size(hosts, HostStatePush, max_items, max_bytes)]
