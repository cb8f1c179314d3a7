"""Estimated spend from the facts (issue 20, item 6): each machine's quote times the hours it has lived.

Pure. A machine's spend is ``price.amount * (end - launch_time) / 3600`` where ``price`` is the quote it was
chosen at (``InstanceFact.price``), ``launch_time`` the provider's launch time, and ``end`` the confirmed return
(``Returned.at``) or, for a live machine, ``now``. Spend is summed by ``(provider, template, currency)``: amounts
in different currencies are never added. What cannot be estimated is counted, never guessed: machines without a
quote (``unpriced``), with a quote not per hour (``other_unit``), or with no launch time or end time
(``no_time``: lost machines, returns confirmed before facts carried a time).

An estimate, not a bill: the quote is the one the planner saw (spot prices move), billing granularity is ignored.
The daemon's view holds live state only (``FactView(prune=True)``), so a machine whose lifecycle ended is not in
its report: spend over the whole history needs the controller's log (docs/fleet.md, "Only the live fleet").
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from provisionerd.planner.fact_view import MachineRecord, MachineState

HOUR = 3600.0


@attrs.frozen
class CostLine:
    provider: str
    template_id: str
    currency: str
    machines: int
    machine_hours: float
    amount: float


@attrs.frozen
class CostReport:
    lines: tuple[CostLine, ...]
    unpriced: int = 0
    other_unit: int = 0
    no_time: int = 0

    def totals(self) -> dict[str, float]:
        """Spend per currency."""
        totals: dict[str, float] = {}
        for line in self.lines:
            totals[line.currency] = totals.get(line.currency, 0.0) + line.amount
        return totals

    def to_json(self) -> dict[str, object]:
        return {
            "lines": [attrs.asdict(line) for line in self.lines],
            "totals": self.totals(),
            "not_estimated": {"unpriced": self.unpriced, "other_unit": self.other_unit, "no_time": self.no_time},
        }


def machine_spend(machine: MachineRecord, now: float) -> tuple[float, float] | None:
    """``(hours, amount)`` of one priced, hourly machine with known times; ``None`` otherwise."""
    quote = machine.price
    if not quote.known or quote.unit != "hour" or not math.isfinite(quote.amount) or quote.amount < 0:
        return None
    if machine.state is MachineState.RETURNED:
        end = machine.ended_at
    elif machine.state.live:
        end = now
    else:
        return None  # lost: when it ended is not known
    if not (machine.launch_time > 0 and end > 0):
        return None
    hours = max(0.0, end - machine.launch_time) / HOUR
    return hours, hours * quote.amount


def estimate(machines: Iterable[MachineRecord], now: float) -> CostReport:
    """The spend of ``machines`` up to ``now`` (wall epoch seconds), by provider, template and currency."""
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite number of seconds, not {now!r}")
    sums: dict[tuple[str, str, str], list[float]] = {}
    unpriced = other_unit = no_time = 0
    for machine in machines:
        quote = machine.price
        if not quote.known:
            unpriced += 1
            continue
        if quote.unit != "hour":
            other_unit += 1
            continue
        spend = machine_spend(machine, now)
        if spend is None:
            no_time += 1
            continue
        entry = sums.setdefault((machine.provider, machine.template_id, quote.currency), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += spend[0]
        entry[2] += spend[1]
    lines = tuple(
        CostLine(provider, template, currency, int(n), round(hours, 6), round(amount, 6))
        for (provider, template, currency), (n, hours, amount) in sorted(sums.items())
    )
    return CostReport(lines, unpriced, other_unit, no_time)
