"""Estimated spend from the facts (issue 20, item 6): each machine's quote times the hours it has lived.

Pure. A machine's spend is ``price.amount * (end - launch_time) / 3600`` where ``price`` is the quote it was
chosen at (``InstanceFact.price``), ``launch_time`` the provider's launch time, and ``end`` the confirmed return
(``Returned.at``) or, for a live machine, ``now``. Spend is summed by ``(provider, template, currency)``: amounts
in different currencies are never added. What cannot be estimated is counted, never guessed: machines without a
quote (``unpriced``), with a quote not per hour (``other_unit``), or with no launch time or end time
(``no_time``: lost machines, returns confirmed before facts carried a time).

An estimate, not a bill: the quote is the one the planner saw (spot prices move), billing granularity is ignored.

Two ways in. ``estimate(machines, now)`` prices machine records (the daemon's view: live state only, since
``FactView(prune=True)`` drops a lifecycle that ended). ``SpendFold`` prices the whole history: fed the facts in log
order (the controller's history query, docs/protocol.md §6.6), it keeps only the machines still open and prices each
one as its lifecycle ends, so its memory follows the live fleet, not the log; ``report(now)`` prices the open ones
to ``now``. Over the same facts the two agree (``estimate`` of an unpruned fold).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from provisionerd.domain.model import CommittedFact, InstanceFact, Lost, OrphanAdopted, Returned
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


class _Sums:
    """Spend summed by ``(provider, template, currency)`` and what could not be estimated, counted."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, str, str], list[float]] = {}
        self.unpriced = self.other_unit = self.no_time = 0

    def add(self, machine: MachineRecord, now: float) -> None:
        quote = machine.price
        if not quote.known:
            self.unpriced += 1
            return
        if quote.unit != "hour":
            self.other_unit += 1
            return
        spend = machine_spend(machine, now)
        if spend is None:
            self.no_time += 1
            return
        entry = self.sums.setdefault((machine.provider, machine.template_id, quote.currency), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += spend[0]
        entry[2] += spend[1]

    def report(self) -> CostReport:
        lines = tuple(
            CostLine(provider, template, currency, int(n), round(hours, 6), round(amount, 6))
            for (provider, template, currency), (n, hours, amount) in sorted(self.sums.items())
        )
        return CostReport(lines, self.unpriced, self.other_unit, self.no_time)


def _finite(now: float) -> None:
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite number of seconds, not {now!r}")


def estimate(machines: Iterable[MachineRecord], now: float) -> CostReport:
    """The spend of ``machines`` up to ``now`` (wall epoch seconds), by provider, template and currency."""
    _finite(now)
    sums = _Sums()
    for machine in machines:
        sums.add(machine, now)
    return sums.report()


class SpendFold:
    """The spend of every machine the facts name, ended or live, folded from the facts in log order.

    A machine opens with its ``InstanceFact`` (or ``OrphanAdopted``: no quote, counted ``unpriced``) and is priced
    when its lifecycle ends: at its ``Returned.at``, or counted ``no_time`` when ``Lost``. Only open machines are
    held. A fact at or below the last index folded is skipped (a page read twice), as ``FactView.apply`` does.
    """

    def __init__(self) -> None:
        self._sums = _Sums()
        self._open: dict[str, MachineRecord] = {}
        self.last_index = 0
        self.facts = 0

    @property
    def open_machines(self) -> int:
        return len(self._open)

    def add(self, committed: CommittedFact) -> None:
        if committed.index <= self.last_index:
            return
        self.last_index = committed.index
        self.facts += 1
        fact = committed.fact
        match fact:
            case InstanceFact():
                if fact.machine_id not in self._open:
                    self._open[fact.machine_id] = MachineRecord(
                        provider=fact.provider,
                        machine_id=fact.machine_id,
                        instance_ref=fact.instance_ref,
                        op_id=fact.op_id,
                        template_id=fact.template_id,
                        hostname="",
                        address="",
                        launch_time=fact.launch_time,
                        price=fact.price,
                    )
            case OrphanAdopted():
                if fact.machine_id not in self._open:
                    self._open[fact.machine_id] = MachineRecord(
                        fact.provider, fact.machine_id, fact.instance_ref, fact.op_id, "", "", "", 0.0, adopted=True
                    )
            case Returned():
                for machine_id in fact.machine_ids:
                    machine = self._open.pop(machine_id, None)
                    if machine is not None:
                        machine.state, machine.ended_at = MachineState.RETURNED, fact.at
                        self._sums.add(machine, fact.at)
            case Lost():
                machine = self._open.pop(fact.machine_id, None)
                if machine is not None:
                    machine.state = MachineState.LOST
                    self._sums.add(machine, 0.0)
            case _:
                pass

    def add_all(self, facts: Iterable[CommittedFact]) -> None:
        for committed in facts:
            self.add(committed)

    def report(self, now: float) -> CostReport:
        """The spend so far: the ended machines as they ended, the open ones up to ``now`` (wall epoch seconds)."""
        _finite(now)
        sums = _Sums()
        sums.sums = {key: list(entry) for key, entry in self._sums.sums.items()}
        sums.unpriced, sums.other_unit, sums.no_time = self._sums.unpriced, self._sums.other_unit, self._sums.no_time
        for machine in self._open.values():
            sums.add(machine, now)
        return sums.report()
