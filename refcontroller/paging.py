"""Split a sequence into pages bounded by item count and by (estimated) encoded size.

Large state (demand, resync facts) goes in several frames, never one giant frame. Sizes are estimates supplied by
the caller (``encoded_bound`` of each item's JSON length), and the byte budget is a quarter of the frame limit. A
single item larger than the budget gets a page of its own; the caller bounds item sizes
(``commits.MAX_FACT_BYTES``).
"""

from __future__ import annotations

from collections.abc import Sequence

from refcontroller.rules import RULES

#: Defaults, the wire's (``provisionerd.wire.paging``): a quarter of the 1 MiB frame for the payload, 500 items.
PAGE_BYTES = 256 * 1024
PAGE_ITEMS = 500
#: A bound of a fact's encoded size from its JSON length: a short text field costs a pointer and a padded word on
#: the wire but a few bytes of JSON, so small facts encode larger than their JSON (a page of 499 small facts after
#: a big one, sized by JSON length, encoded to ~287 KB: the conformance kit's page-bounds row).
ENCODED_PER_JSON_BYTE = 2
ENCODED_PER_ITEM = 64


def encoded_bound(json_length: int) -> int:
    """An upper bound of the encoded size of an item whose JSON is ``json_length`` bytes long."""
    return ENCODED_PER_JSON_BYTE * json_length + ENCODED_PER_ITEM


def page_bounds(sizes: Sequence[int], max_bytes: int = PAGE_BYTES, max_items: int = PAGE_ITEMS) -> list[range]:
    """Index ranges into ``sizes``, in order, covering every item once; ``[range(0, 0)]`` when empty.

    Each page holds at most ``max_items`` items and at most ``max_bytes`` of size, except a single item that is
    larger than ``max_bytes`` on its own.
    """
    if max_bytes < 1 or max_items < 1:
        raise ValueError(f"page limits must be positive, not {max_bytes!r}, {max_items!r}")
    pages: list[range] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if RULES.page_bounds and i > start and (used + size > max_bytes or i - start >= max_items):
            pages.append(range(start, i))
            start, used = i, 0
        used += size
    pages.append(range(start, len(sizes)))
    return pages if len(sizes) else [range(0, 0)]
