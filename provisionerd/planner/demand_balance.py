"""Which demand items have fewer, and which more, ACTIVE machines than a snapshot wants, kept as the counts change.

A plan pass serves the items short of what they want and takes idle machines from the items that have more. Both
were found by reading every item of the snapshot and every item with machines, each pass: at 10,000 items (1M
tracked machines) two loops of a cache miss per item, 3.3 of a 16 ms pass, run again on every pass though nothing
changed. :class:`DemandBalance` keeps the two sets instead, against one wanted mapping (a snapshot's, bound by
identity: :class:`~provisionerd.planner.demand_index.DemandIndex` keeps one per snapshot object). The
:class:`~provisionerd.planner.fact_view.FactView` that owns it calls :meth:`counted` whenever an item's ACTIVE count
changes; binding another wanted mapping (a new snapshot) rebuilds both sets in one pass over the items.

The sets are of the view's counts, before a pass lowers any of them for the machines it retires: a pass reads
``short`` together with the items it lowered, and ``over`` as candidates it checks against its own counts
(:func:`provisionerd.planner.supply.tally`, :func:`provisionerd.planner.plan.plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Set


class DemandBalance:
    """``short``: items of the bound wanted mapping with fewer ACTIVE machines than wanted; ``over``: items with
    more ACTIVE machines than wanted (an item not in the mapping wants none). Read-only for callers."""

    def __init__(self, active: Mapping[str, int]) -> None:
        self._active = active  # the owning view's demand_id -> ACTIVE machines
        self._wanted: Mapping[str, int] | None = None
        self._short: set[str] = set()
        self._over: set[str] = set()

    def counted(self, demand_id: str, active: int) -> None:
        """``demand_id`` has ``active`` ACTIVE machines now (0: none left)."""
        wanted = self._wanted
        if wanted is None:
            return
        want = wanted.get(demand_id, 0)
        if active < want:
            self._short.add(demand_id)
        else:
            self._short.discard(demand_id)
        if active > want:
            self._over.add(demand_id)
        else:
            self._over.discard(demand_id)

    def bind(self, wanted: Mapping[str, int]) -> None:
        """Keep the sets against ``wanted`` (demand_id -> count; never changed while bound). Rebuilt only when
        ``wanted`` is another object than the one bound."""
        if wanted is self._wanted:
            return
        active = self._active
        self._wanted = wanted
        self._short = {demand_id for demand_id, want in wanted.items() if active.get(demand_id, 0) < want}
        self._over = {demand_id for demand_id, n in active.items() if n > wanted.get(demand_id, 0)}

    def short(self, wanted: Mapping[str, int]) -> Set[str]:
        """The items of ``wanted`` with fewer ACTIVE machines than it wants."""
        self.bind(wanted)
        return self._short

    def over(self, wanted: Mapping[str, int]) -> Set[str]:
        """The items with more ACTIVE machines than ``wanted`` wants."""
        self.bind(wanted)
        return self._over
