"""What this process planned that the facts do not show yet: read by the planner, kept by the op book.

The planner keeps no record of an op. Each action it plans is claimed at once in the executor's op book
(``execution.op_book``: one record per op, from plan to settled), which keeps the action and when it was planned
until it is dropped (the gate refused it, its provider turned unhealthy, it was handed back) or forgotten (no longer
open in the facts and not running). Each plan reads them as an ``InFlight`` (``OpBook.in_flight``) and keeps only
those the facts do not show yet (``unseen``), so a replay of the same snapshot does not plan them twice:

- a request until its intent is in the facts (then its age carries over to the intent: ``planned_at``);
- a return or a lost mark until its machine is no longer active;
- a fail until its intent is closed.

Pure: built from (action, planned_at) pairs (``InFlight.of``), so hypothesis and the tests drive it without a book.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from provisionerd.domain.actions import Action, FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.planner.fact_view import FactView, MachineState


@attrs.frozen
class PendingRequest:
    """A ``RequestMachines`` planned at ``planned_at`` whose intent the facts do not show yet."""

    provider: str
    template_id: str
    demand_id: str
    count: int
    planned_at: float

    @classmethod
    def of(cls, action: RequestMachines, planned_at: float) -> PendingRequest:
        return cls(action.provider, action.template_id, action.demand_id, action.count, planned_at)


@attrs.frozen
class InFlight:
    requests: Mapping[str, PendingRequest] = attrs.field(factory=dict)  # op_id -> request
    returns: Mapping[str, str] = attrs.field(factory=dict)  # machine_id -> return op_id
    lost: Mapping[str, str] = attrs.field(factory=dict)  # machine_id -> lost op_id
    fails: Mapping[str, str] = attrs.field(factory=dict)  # intent op_id -> provider

    @classmethod
    def of(cls, planned: Iterable[tuple[Action, float]]) -> InFlight:
        """The in-flight record of each planned action (its ``planned_at``); drains and others are not kept."""
        requests: dict[str, PendingRequest] = {}
        returns: dict[str, str] = {}
        lost: dict[str, str] = {}
        fails: dict[str, str] = {}
        for action, planned_at in planned:
            match action:
                case RequestMachines():
                    requests[action.op_id] = PendingRequest.of(action, planned_at)
                case ReturnMachines():
                    returns.update(dict.fromkeys(action.machine_ids, action.op_id))
                case MarkLost():
                    lost[action.machine_id] = action.op_id
                case FailRequest():
                    fails[action.op_id] = action.provider
        return cls(requests, returns, lost, fails)

    @property
    def retiring(self) -> frozenset[str]:
        """The machines a return or a lost mark is under way for."""
        return frozenset(self.returns.keys() | self.lost.keys())

    def unseen(self, view: FactView) -> tuple[InFlight, dict[str, float]]:
        """Only what the facts do not show yet, and the ``planned_at`` of each request whose intent they now show
        (its age carries over to the intent)."""
        machines, intents = view.machines, view.intents
        committed = {op: r.planned_at for op, r in self.requests.items() if op in intents}

        def still_active(machine_id: str) -> bool:
            record = machines.get(machine_id)
            return record is not None and record.state is MachineState.ACTIVE

        def still_open(op_id: str) -> bool:
            record = intents.get(op_id)
            return record is not None and record.open

        unseen = InFlight(
            {k: v for k, v in self.requests.items() if k not in intents},
            {k: v for k, v in self.returns.items() if still_active(k)},
            {k: v for k, v in self.lost.items() if still_active(k)},
            {k: v for k, v in self.fails.items() if still_open(k)},
        )
        return unseen, committed


#: Nothing planned before (the planner's tests, the admin's outlook before the first plan).
NOTHING_IN_FLIGHT = InFlight()
