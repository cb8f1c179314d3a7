"""The idle pool of one plan pass: idle machines other items do not need, per offer, kept as the runs they came in.

:func:`provisionerd.planner.allocate.excess_pool` fills it with each giving item's surplus (the head of the item's
idle entries, longest idle first); demand items reuse from it (the most recently idle first); what is left and idle
for its provider's ``idle_time`` is returned (:meth:`IdlePool.due`).

Each giving item's surplus is added as a *run*, already in order: the head of the entries the host table keeps
between passes (not copied: a copy writes every entry's reference count, a cache miss each at 1M machines). An
offer's runs are merged and sorted only when an item first takes from it (:meth:`entries`), and the due machines are
read from the head of each run. So a pass where nothing is reused reads only the entries that are due plus one per
run, instead of every surplus entry twice (a per-offer sort, then a loop over all of them to find the due ones: at
1M tracked machines, 10,000 surplus entries and 2.7 of a 13 ms pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from provisionerd.planner.host_table import IdleEntry
from provisionerd.planner.offers import OfferKey


class IdlePool:
    """Per offer: runs of idle entries (each longest idle first, ties by machine id), or once taken from, one list
    in that order (the most recently idle last: :meth:`entries`)."""

    def __init__(self) -> None:
        self._runs: dict[OfferKey, list[tuple[Sequence[IdleEntry], int]]] = {}  # (entries, how many of them)
        self._merged: dict[OfferKey, list[IdleEntry]] = {}

    def add(self, key: OfferKey, entries: Sequence[IdleEntry], stop: int | None = None) -> None:
        """Add the first ``stop`` (default: all) of ``entries`` (in order; not changed afterwards) to ``key``'s."""
        stop = len(entries) if stop is None else min(stop, len(entries))
        if stop <= 0:
            return
        merged = self._merged.get(key)
        if merged is not None:
            merged.extend(entries[:stop])
            merged.sort()
        else:
            self._runs.setdefault(key, []).append((entries, stop))

    def __bool__(self) -> bool:
        return bool(self._runs) or any(self._merged.values())

    def keys(self) -> Iterator[OfferKey]:
        """Every offer that has (or had) machines in the pool."""
        yield from self._runs
        yield from self._merged

    def count(self, key: OfferKey) -> int:
        """How many of ``key``'s machines are in the pool."""
        merged = self._merged.get(key)
        if merged is not None:
            return len(merged)
        return sum(stop for _, stop in self._runs.get(key, ()))

    def entries(self, key: OfferKey) -> list[IdleEntry]:
        """``key``'s machines, longest idle first, ties by machine id: the list to take from (``pop()``: the most
        recently idle) or remove from; the pool holds it from now on."""
        merged = self._merged.get(key)
        if merged is None:
            runs = self._runs.pop(key, ())
            merged = [entry for entries, stop in runs for entry in entries[:stop]]
            if len(runs) > 1:
                merged.sort()
            self._merged[key] = merged
        return merged

    def due(
        self, now: float, idle_time_of: Callable[[str], float], wake: Callable[[float, float], None]
    ) -> dict[str, list[IdleEntry]]:
        """The machines idle for their provider's ``idle_time`` at ``now`` (``now - since >= idle_time``), by
        provider, in no particular order; ``wake(at, now)`` is told when the first of each run or list that is not
        due will be."""
        by_provider: dict[str, list[IdleEntry]] = {}
        for key, runs in (*self._runs.items(), *((k, ((m, len(m)),)) for k, m in self._merged.items())):
            idle_time = idle_time_of(key[0])
            found = by_provider.setdefault(key[0], [])
            for entries, stop in runs:
                for i in range(stop):  # longest idle first: the due ones are a head of the run
                    entry = entries[i]
                    if now - entry[0] >= idle_time:
                        found.append(entry)
                    else:
                        wake(entry[0] + idle_time, now)
                        break
        return by_provider
