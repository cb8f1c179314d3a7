"""The current level-triggered demand: the whole wanted state, with a sequence number.

``seq`` grows by one on every change (a set whose items equal the current ones is no change) and never goes back:
the snapshot is stored, so a restart continues from the stored ``seq``. A daemon keeps only the snapshot with the
highest ``seq`` it has seen, so a lower one after a restart would be ignored for ever.
"""

from __future__ import annotations

from collections.abc import Sequence

from provisionerd.domain.model import DemandItem, DemandSnapshot

#: Bounds on what an admin may set: an item count and a demand_id length. Pages keep each frame small.
MAX_ITEMS = 100_000
MAX_ID = 256


def problems(items: Sequence[DemandItem]) -> list[str]:
    """What is wrong with a demand (empty when it is acceptable)."""
    found: list[str] = []
    if len(items) > MAX_ITEMS:
        found.append(f"at most {MAX_ITEMS} demand items, not {len(items)}")
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, DemandItem):
            found.append(f"items[{i}]: not a DemandItem")
            continue
        if not item.demand_id or len(item.demand_id) > MAX_ID:
            found.append(f"items[{i}].demand_id: must be 1..{MAX_ID} characters")
        elif item.demand_id in seen:
            found.append(f"items[{i}].demand_id: {item.demand_id!r} appears twice")
        seen.add(item.demand_id)
        if item.count < 0:
            found.append(f"items[{i}].count: must be >= 0, not {item.count}")
        if item.max_hourly_cost is not None and not item.max_hourly_cost >= 0:
            found.append(f"items[{i}].max_hourly_cost: must be >= 0")
    return found


def next_snapshot(current: DemandSnapshot, items: Sequence[DemandItem]) -> DemandSnapshot | None:
    """The snapshot that replaces ``current`` with ``items``, or ``None`` when nothing changes."""
    items = tuple(items)
    if items == current.items:
        return None
    return DemandSnapshot(seq=current.seq + 1, items=items)
