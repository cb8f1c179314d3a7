"""The current level-triggered demand: the whole wanted state, with a sequence number.

``seq`` grows by one on every change (a set whose items equal the current ones is no change) and never goes back:
the snapshot is stored, so a restart continues from the stored ``seq``. A daemon keeps only the snapshot with the
highest ``seq`` it has seen, so a lower one after a restart would be ignored for ever.
"""

from __future__ import annotations

from collections.abc import Sequence

from provisionerd.domain.model import DemandItem, DemandSnapshot, LicenseUse

#: Bounds on what an admin may set: an item count and a demand_id length. Pages keep each frame small.
MAX_ITEMS = 100_000
MAX_ID = 256
#: Licence uses (provider, pool) an admin may set with the demand: they travel on the demand's first page.
MAX_LICENSES = 1000


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


def license_problems(licenses: Sequence[LicenseUse]) -> list[str]:
    """What is wrong with the licence use an admin sets alongside the demand (empty when acceptable)."""
    found: list[str] = []
    if len(licenses) > MAX_LICENSES:
        found.append(f"at most {MAX_LICENSES} licence uses, not {len(licenses)}")
    seen: set[tuple[str, str]] = set()
    for i, use in enumerate(licenses[:MAX_LICENSES]):
        if not isinstance(use, LicenseUse):
            found.append(f"licenses[{i}]: not a LicenseUse")
            continue
        if not use.provider or not use.pool or len(use.provider) > MAX_ID or len(use.pool) > MAX_ID:
            found.append(f"licenses[{i}]: provider and pool must be 1..{MAX_ID} characters")
        elif (use.provider, use.pool) in seen:
            found.append(f"licenses[{i}]: {use.provider!r}/{use.pool!r} appears twice")
        seen.add((use.provider, use.pool))
        if use.in_use < 0:
            found.append(f"licenses[{i}].in_use: must be >= 0, not {use.in_use}")
    return found


def next_snapshot(
    current: DemandSnapshot, items: Sequence[DemandItem], licenses: Sequence[LicenseUse] = ()
) -> DemandSnapshot | None:
    """The snapshot that replaces ``current`` with ``items`` and ``licenses``, or ``None`` when nothing changes."""
    items, uses = tuple(items), tuple(licenses)
    if items == current.items and uses == current.licenses:
        return None
    return DemandSnapshot(seq=current.seq + 1, items=items, licenses=uses)
