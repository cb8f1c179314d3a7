"""Paged plugin documents: ``listMachines`` and ``getReturnRequests`` answer one page at a time.

The contract (``schemas/``, ``docs/providers.md`` "Paging")::

    input   {..., "cursor"?: str, "pageSize"?: int}    no cursor: the first page
    output  {..., "nextCursor"?: str | null}           absent or null: the last page

A plugin that does not page ignores both and answers everything with no ``nextCursor``: one page, so an older
plugin works unchanged (compatible by construction). The cursor is the plugin's own, opaque to the daemon; the
shipped plugins use a keyset cursor (the last ``machineId`` of the page, pages in ``machineId`` order:
``keyset_page``), which never repeats or skips an entry that stays put while others come and go.

This module is pure: ``PageJoin`` joins the pages of one read and refuses what a hostile or broken plugin can do
to make the daemon loop or hold without bound, each as a typed ``PagingViolation`` (a ``ProviderProtocolViolation``,
so an orphan pass reads it as ``listing_unreadable`` with this reason):

- a cursor it already followed in this read (a loop: the same page again and again);
- more pages than ``max_pages`` (an endless sequence; the caller derives the cap from the expected fleet size);
- a page with more entries than ``page_size`` asked for (a plugin that ignores ``pageSize`` answers with no
  ``nextCursor``: that one page is allowed, an older plugin's whole answer, under the transport's line cap).

An entry seen twice (an offset cursor while the fleet changes) is kept once, the later page's copy winning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

from provisionerd.domain.errors import ProviderProtocolViolation

T = TypeVar("T")

#: ``listMachines`` entries per page: ~320 B each, so ~160 KB a line, 1/50 of the 8 MiB line cap; the transport
#: validates a page in one stretch of the event loop (~5 ms for 500 on this machine), so the page size bounds it
#: (``bench/listing.py``).
LIST_PAGE_SIZE = 500
#: Entries of a page read into values between two checkpoints (~3 ms for 250).
READ_SLICE = 250
#: ``getReturnRequests``: live machines named per request (~80 B each), and the answer's page size.
RECLAIM_CHUNK = 2000
#: Pages a read may take are ``ceil(FLEET_SLACK * expected / page_size) + 1``, with ``expected`` at least
#: ``MIN_EXPECTED``: room for a fleet that grew, leaked or doubled since it was last counted, and a bound on a
#: plugin that never says "last page".
FLEET_SLACK = 4
MIN_EXPECTED = 10_000
MAX_CURSOR = 4096


class PagingViolation(ProviderProtocolViolation):
    """The pages of one read do not join up: a cursor loop, too many pages, or a page larger than asked."""


def max_pages(expected: int, page_size: int) -> int:
    """The most pages one read of a fleet of about ``expected`` entries may take (see ``FLEET_SLACK``)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, not {page_size!r}")
    return math.ceil(FLEET_SLACK * max(expected, MIN_EXPECTED) / page_size) + 1


def page_input(document: Mapping[str, Any], cursor: str | None, page_size: int) -> dict[str, Any]:
    """``document`` (the action's input) asking for ``page_size`` entries after ``cursor`` (None: the first)."""
    paged = {**document, "pageSize": page_size}
    if cursor is not None:
        paged["cursor"] = cursor
    return paged


def next_cursor(provider: str, action: str, document: Mapping[str, Any]) -> str | None:
    """The output's ``nextCursor`` (None: the last page). The schema already checked its type and length."""
    cursor = document.get("nextCursor")
    if cursor is None:
        return None
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR:
        raise PagingViolation(provider, action, f"nextCursor must be a non-empty string, not {cursor!r:.80}")
    return cursor


@attrs.define(eq=False)
class PageJoin(Generic[T]):
    """The pages of one read, joined (see the module docstring). ``add`` each page as it arrives; it returns
    the cursor to ask for next, or None when the read is complete; ``items`` is the joined answer."""

    provider: str
    action: str
    page_size: int
    max_pages: int
    key: Callable[[T], Hashable]
    pages: int = 0
    duplicates: int = 0
    _items: dict[Hashable, T] = attrs.field(factory=dict)
    _cursors: set[str] = attrs.field(factory=set)

    def add(self, entries: Sequence[T], cursor: str | None, *, size: int | None = None) -> str | None:
        """``size``: how many entries the page had, when ``entries`` are only those the reader keeps of it."""
        self.pages += 1
        size = len(entries) if size is None else size
        if cursor is not None and size > self.page_size:
            raise PagingViolation(
                self.provider, self.action, f"page {self.pages} has {size} entries, {self.page_size} asked"
            )
        items = self._items
        page = dict(zip(map(self.key, entries), entries, strict=True))
        if len(page) == len(entries) and items.keys().isdisjoint(page):
            items.update(page)  # the usual page: no key twice, none seen before (~3x the loop's speed)
        else:
            for entry in entries:
                key = self.key(entry)
                if key in items:
                    self.duplicates += 1
                    del items[key]  # the later copy wins, in its page's place
                items[key] = entry
        if cursor is None:
            return None
        if cursor in self._cursors:
            raise PagingViolation(
                self.provider, self.action, f"cursor loop: page {self.pages} returned cursor {cursor!r:.80} again"
            )
        if self.pages >= self.max_pages:
            raise PagingViolation(
                self.provider,
                self.action,
                f"more than {self.max_pages} pages of {self.page_size} (the cap for the expected fleet); "
                "the plugin never said the last page",
            )
        self._cursors.add(cursor)
        return cursor

    @property
    def items(self) -> tuple[T, ...]:
        return tuple(self._items.values())


def join_pages(
    pages: Iterable[tuple[Sequence[T], str | None]],
    key: Callable[[T], Hashable],
    *,
    page_size: int,
    limit: int,
    provider: str = "p",
    action: str = "listMachines",
) -> tuple[T, ...]:
    """Join ``pages`` (each ``(entries, next_cursor)``, in the order they were read) with ``PageJoin``; stops
    at the first page without a next cursor. ``PagingViolation`` as ``PageJoin.add`` says."""
    join: PageJoin[T] = PageJoin(provider, action, page_size, limit, key)
    for entries, cursor in pages:
        if join.add(entries, cursor) is None:
            break
    return join.items


def keyset_page(
    entries: Sequence[Mapping[str, Any]], cursor: str | None, page_size: int | None, key: str = "machineId"
) -> tuple[list[Mapping[str, Any]], str | None]:
    """The reference plugin-side pager: ``entries`` in ``key`` order after ``cursor``, at most ``page_size``,
    and the next cursor (the page's last key) when more follow. No ``page_size``: everything, one page."""
    ordered = sorted(entries, key=lambda e: str(e[key]))
    if cursor is not None:
        ordered = [e for e in ordered if str(e[key]) > cursor]
    if page_size is None or len(ordered) <= page_size:
        return ordered, None
    page = ordered[:page_size]
    return page, str(page[-1][key])
