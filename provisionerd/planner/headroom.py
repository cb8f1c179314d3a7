"""Warm headroom (issue 35 item 4): per template, ``min_idle`` machines kept joined above the demand, so that work
which arrives finds a machine booted (ParallelCluster's minimum count, CycleCloud's idle nodes).

Pure; part of :func:`provisionerd.planner.plan.plan`.

Each rule (``providers[].headroom``: template, ``min_idle``, optional daily ``hours`` in UTC) becomes a demand item
of its own, ``headroom:<provider>/<template>``, pinned to its provider and template (``offers.PinnedItem``) and
served after every real item, so that it takes only what the caps, the limits and the step leave. Its machines are
the daemon's like any other's: tagged, counted against ``max_machines`` and the resource limits, priced by the cost
estimate under their own demand id.

A headroom machine is lent first. Every idle machine of a headroom item is in the idle pool the real items reuse
before they request (``allocate.excess_pool``), so demand that arrives takes the warm machines before any new one is
asked for; the headroom item then counts only what it did not lend and asks for the rest again
(:func:`settle_pool`), which keeps the fleet at the demand plus ``min_idle`` while the warm machines serve it.
Within ``min_idle`` its machines are never returned for idleness; above it (the demand that borrowed left, or the
rule changed) the longest idle go after ``idle_time`` like any surplus, and outside its hours the rule wants none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import attrs

from provisionerd.domain.model import ResourceShape
from provisionerd.planner.idle_pool import IdlePool
from provisionerd.planner.offers import PinnedItem

#: The demand id of a headroom item: ``headroom:<provider>/<template>`` (a controller's demand ids never start so:
#: the controller's schema allows letters, digits and ``-_.:/`` but a real item named so would be taken for one).
PREFIX = "headroom:"
DAY = 86_400


@attrs.frozen
class Headroom:
    """``min_idle`` warm machines of ``provider``'s ``template_id``; ``hours``: ``(start, end)`` seconds of the UTC
    day when it applies (``start > end`` wraps past midnight; ``None``: always)."""

    provider: str
    template_id: str
    min_idle: int
    hours: tuple[int, int] | None = None

    @property
    def demand_id(self) -> str:
        return f"{PREFIX}{self.provider}/{self.template_id}"

    def wanted_at(self, now: float) -> int:
        """How many warm machines the rule wants at wall time ``now`` (0 outside its hours)."""
        if self.hours is None:
            return self.min_idle
        start, end = self.hours
        second = int(now) % DAY
        inside = start <= second < end if start <= end else (second >= start or second < end)
        return self.min_idle if inside else 0


def parse_hours(text: str) -> tuple[int, int] | None:
    """``"08:00-18:00"`` -> seconds of the day (``""``: always). ``ValueError`` names what is wrong."""
    if not text:
        return None
    try:
        first, second = text.split("-")
        start, end = (_seconds(part) for part in (first, second))
    except ValueError:
        raise ValueError(f"hours {text!r}: expected HH:MM-HH:MM (UTC), e.g. 08:00-18:00") from None
    if start == end:
        raise ValueError(f"hours {text!r}: start and end are the same (leave hours out for all day)")
    return start, end


def _seconds(part: str) -> int:
    hours, minutes = part.strip().split(":")
    h, m = int(hours), int(minutes)
    if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m):
        raise ValueError(part)
    return h * 3600 + m * 60


def is_headroom(demand_id: str) -> bool:
    return demand_id.startswith(PREFIX)


def items(rules: Sequence[Headroom], now: float) -> tuple[PinnedItem, ...]:
    """The demand items of ``rules`` at ``now`` (count 0 outside their hours: their machines become surplus)."""
    return tuple(
        PinnedItem(
            rule.demand_id,
            ResourceShape(),
            rule.wanted_at(now),
            providers=(rule.provider,),
            templates=(rule.template_id,),
        )
        for rule in rules
    )


def settle_pool(
    pool: IdlePool,
    listed: Mapping[str, int],
    active: MutableMapping[str, int],
    wanted: Mapping[str, int],
    ids: Iterable[str],
) -> dict[str, int]:
    """After the real items have reused from ``pool``: per headroom item, how many of its idle machines they took
    (``listed``: how many it put in the pool); its ``active`` count drops by that (it asks for them again), and of
    its idle machines left in the pool only those above its ``wanted`` count stay there (the longest idle: returned
    after ``idle_time``); the rest leave the pool (kept warm). Returns the lent counts."""
    ids = set(ids)
    left: dict[str, list[tuple[tuple[str, str], Any]]] = {h: [] for h in ids}
    for key in list(pool.keys()):
        for entry in pool.entries(key):
            demand_id = getattr(entry[2], "demand_id", "")
            if demand_id in ids:
                left[demand_id].append((key, entry))
    lent: dict[str, int] = {}
    for h, mine in left.items():
        lent[h] = listed.get(h, 0) - len(mine)
        own = active.get(h, 0) - lent[h]
        active[h] = own
        surplus = max(0, own - wanted.get(h, 0))
        mine.sort(key=lambda e: (e[1][0], e[1][1]))  # longest idle first, then machine id
        for key, entry in mine[surplus:]:
            pool.entries(key).remove(entry)
    return lent


class WantedWith(Mapping[str, int]):
    """``base`` (a snapshot's wanted counts, maybe 100,000 of them: not copied) with ``top`` in front."""

    def __init__(self, top: Mapping[str, int], base: Mapping[str, int]) -> None:
        self._top, self._base = top, base

    def __getitem__(self, key: str) -> int:
        return self._top[key] if key in self._top else self._base[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._top
        yield from (key for key in self._base if key not in self._top)

    def __len__(self) -> int:
        return len(self._top) + sum(1 for key in self._base if key not in self._top)
