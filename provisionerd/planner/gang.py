"""All-or-nothing demand items (issue 35, item 5): an MPI job needs all N machines or none.

Pure; part of :func:`provisionerd.planner.plan.plan`. An item with ``all_or_nothing`` is served whole or not at all:

- **One offer, one op.** Its deficit is served by one offer (``Allocator.serve``): the first in choice order
  (priority, then price) whose idle machines (other items' surplus, warm headroom) and room for one
  ``RequestMachines`` of the rest hold all of it, under ``maxNumber``, the provider's cap and its resource limits.
  Idle machines of any other offer are never taken (they would split it), and it is never split across offers. A
  deficit larger than a step limit goes alone into an empty step window (it could never go otherwise); one that fits
  waits for room like any request. When no offer has room for the whole deficit, nothing is asked and an
  ``unmet_demand`` note says so, naming what held each offer.
- **Only where the plugin can say it.** Offers of a provider whose plugin does not declare
  ``features.allOrNothing`` are incompatible with such an item (``Catalog.gang``, read from ``describeProvider`` by
  the reconcile loop while the demand holds such an item; ``offers.gang_unsupported`` says why). The legacy LSF
  contract has no way to say it, so a legacy provider never gets one.
- **A partial answer is returned whole.** A request op of such an item that ends with fewer machines than it asked
  for (``RequestFailed``: a partial answer, a timeout, a recovery that found fewer) has the machines it made
  returned with reason ``all_or_nothing`` (:func:`broken_members`): at once when not joined or idle, when idle if
  the controller placed work on one meanwhile. They are not supply from then on, so the whole deficit is asked
  again, after the capacity back-off the executor records for the offer (``execution.request_flow``).

Level-triggered: the rule reads only the intent (``RequestIntent.all_or_nothing``) and the facts, so a restarted
daemon returns the same machines (``FactView.broken_gangs`` keeps the ops).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping

from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner.fact_view import FactView, MachineRecord, MachineState

#: The return reason of a machine made by an all-or-nothing op that ended short.
ALL_OR_NOTHING = "all_or_nothing"


def broken_members(
    view: FactView, hosts: Mapping[str, HostState], skip: Container[str]
) -> Iterator[tuple[MachineRecord, bool]]:
    """``(machine, busy)`` for each ACTIVE machine not in ``skip`` of an all-or-nothing op that ended short
    (``FactView.broken_gangs``): a busy one (the controller placed work on it) is returned once idle."""
    for op_id in view.broken_gangs:
        record = view.intents.get(op_id)
        if record is None:
            continue
        for machine_id in record.machine_ids:
            machine = view.machines.get(machine_id)
            if machine is None or machine.state is not MachineState.ACTIVE or machine_id in skip:
                continue
            host = hosts.get(machine.instance_ref)
            yield machine, host is not None and host.status is HostStatus.BUSY
