"""What a plan pass derives from a demand snapshot alone, computed once per snapshot and reused across passes.

A snapshot is level-triggered: the daemon plans against the same one many times (every tick, every fact, every
host change) until the controller sends a newer one. Validating and sorting its items, their wanted counts and
each item's compatibility :class:`~provisionerd.planner.offers.Requirement` depend on nothing else, so they are
kept here instead of being rebuilt by every pass (at 1,000 items that rebuild is about a tenth of a pass).

The cache is keyed on the snapshot *object* (``is``), not on equality: hashing a snapshot of 100,000 items would
cost more than the work it saves, and a frozen snapshot object never changes. It holds the last few snapshots only,
so one process can plan for several providers (or, in the simulation, several daemons) without thrashing.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from provisionerd.domain.actions import Note
from provisionerd.domain.model import RELEASE_MODES, DemandItem, DemandSnapshot
from provisionerd.planner.offers import Requirement, requirement_of

#: How many recent snapshots are remembered.
CACHE_SIZE = 4


@attrs.frozen(eq=False)
class DemandIndex:
    """A snapshot's valid items by demand_id (sorted), their wanted counts, and the notes about invalid items.

    Read-only for its users: it is shared by every pass over the same snapshot.
    """

    snapshot: DemandSnapshot
    items: Mapping[str, DemandItem]
    wanted: Mapping[str, int]  # demand_id -> max(count, 0)
    notes: tuple[Note, ...]
    #: Every reservation an item names (``planner.release``: machines of the others are released).
    reservations: frozenset[str] = frozenset()
    _requirements: dict[str, Requirement] = attrs.field(factory=dict)
    _shared: dict[Requirement, Requirement] = attrs.field(factory=dict)

    def requirement(self, item: DemandItem) -> Requirement:
        """``requirement_of(item)``, computed once per item of this snapshot; items with equal requirements share
        one object (a catalog's caches keyed on it then find it by identity, not by comparing every field)."""
        found = self._requirements.get(item.demand_id)
        if found is None:
            made = requirement_of(item)
            found = self._requirements[item.demand_id] = self._shared.setdefault(made, made)
        return found


def build(snapshot: DemandSnapshot) -> DemandIndex:
    """Index ``snapshot``: an empty or repeated demand_id is left out with an ``invalid_demand`` note."""
    items: dict[str, DemandItem] = {}
    notes: list[Note] = []
    for item in snapshot.items:
        if item.demand_id in items or not item.demand_id:
            notes.append(Note("invalid_demand", "empty or duplicate demand_id: item ignored", demand_id=item.demand_id))
            continue
        if item.release not in RELEASE_MODES:
            detail = f"unknown release {item.release[:64]!r}: its machines are returned after idle_time"
            notes.append(Note("invalid_demand", detail, demand_id=item.demand_id))
        items[item.demand_id] = item
    ordered = dict(sorted(items.items()))
    wanted = {demand_id: max(item.count, 0) for demand_id, item in ordered.items()}
    reservations = frozenset(item.reservation for item in ordered.values() if item.reservation)
    return DemandIndex(snapshot, ordered, wanted, tuple(notes), reservations=reservations)


_recent: list[DemandIndex] = []  # most recent last


def demand_index(snapshot: DemandSnapshot) -> DemandIndex:
    """The :class:`DemandIndex` of ``snapshot``, from the cache when this very object was indexed lately."""
    for index in _recent:
        if index.snapshot is snapshot:
            return index
    index = build(snapshot)
    _recent.append(index)
    if len(_recent) > CACHE_SIZE:
        del _recent[0]
    return index
