"""Release on completion (issue 20, item 3): a reservation's machines go back as soon as it leaves the demand.

Pure; part of :func:`provisionerd.planner.plan.plan`. A demand item may name a ``reservation`` and ask for
``release = "on_completion"``; the request planned for it carries both on its intent (``RequestIntent``), so every
machine made for it is tagged with them in the facts. When no item of the current snapshot names the reservation
any more, each such machine that is joined and idle is returned at once (reason ``released``) instead of after its
provider's ``idle_time``, and no other item may reuse it. A busy one goes at its next idle moment; one not joined
yet waits for its join (or its join deadline).

Level-triggered like the rest: the decision reads only the current snapshot and the facts, so a lost snapshot
delays the release to the next one (or the resync's), a replayed one plans nothing new (the returns are in
flight), and a restarted daemon releases the same machines. No snapshot (demand unknown) releases nothing.
"""

from __future__ import annotations

from collections.abc import Set

from provisionerd.domain.model import RELEASE_ON_COMPLETION
from provisionerd.planner.fact_view import FactView, MachineRecord
from provisionerd.planner.supply import Tally

#: The return reason of a machine released on completion.
RELEASED = "released"


def release_completed(counts: Tally, view: FactView, reservations: Set[str]) -> list[tuple[str, MachineRecord]]:
    """Take out of ``counts`` (its idle lists and active counts) every idle machine made for a reservation with
    release on completion that is not in ``reservations`` (those the demand still names), and return them as
    ``(RELEASED, machine)``.

    Only the idle lists are read: they hold the joined, idle machines of every item whose supply exceeds its
    wanted count, which includes every item gone from the demand. Cost: nothing while no intent of the view asks
    for release on completion (``FactView.on_completion``), else one set lookup per idle entry.
    """
    released: list[tuple[str, MachineRecord]] = []
    marked = view.on_completion
    if not marked:
        return released
    intents = view.intents
    for demand_id, entries in counts.idle.items():
        kept = []
        for entry in entries:
            op_id = entry[2].op_id
            record = intents.get(op_id) if op_id in marked else None
            if record is not None and _completed(record.intent.release, record.intent.reservation, reservations):
                released.append((RELEASED, entry[2]))
            else:
                kept.append(entry)
        if len(kept) != len(entries):
            counts.lower(demand_id, len(entries) - len(kept))
            counts.idle[demand_id] = kept  # the list is the host table's: replaced, not changed
    return released


def _completed(release: str, reservation: str, reservations: Set[str]) -> bool:
    return release == RELEASE_ON_COMPLETION and reservation not in reservations
