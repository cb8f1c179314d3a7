"""A fact this daemon commits while a resync is collected is in the view that resync builds (issue 18 item 3).

The controller answers commits between resync pages, and the pages were fixed when the resync began, so they may
not hold it: without this the new view would forget an intent the daemon just committed (and plan it again)."""

from __future__ import annotations

import itertools

import trio

from provisionerd.controller.link import Link
from provisionerd.controller.pulse import Pulse
from provisionerd.controller.view import ResyncCollector
from provisionerd.domain.model import CommittedFact, Epoch, RequestIntent
from provisionerd.wire.messages import ResyncPage

FACT = CommittedFact(9, RequestIntent("aws", Epoch(1, 1), "op-9", "t", 1, ("r",), ("a" * 64,)))
OLDER = CommittedFact(3, RequestIntent("aws", Epoch(1, 1), "op-3", "t", 1, ("q",), ("b" * 64,)))


def _link(updated: Pulse) -> Link:
    return Link(
        None,  # type: ignore[arg-type]  # never run: only its routing is exercised
        1,
        "ctl",
        1,
        2.0,
        6.0,
        10.0,
        updated=updated,
        corr=itertools.count(1),
        providers=("aws",),
    )


def test_a_commit_acknowledged_during_a_resync_is_folded_into_its_view() -> None:
    async def main() -> None:
        updated = Pulse()
        link = _link(updated)
        link._resync, link._resync_corr = ResyncCollector(), 5
        link.note_committed(FACT)
        link._route(ResyncPage(0, 1, (OLDER,), ()), 5)
        assert link.view is not None and set(link.view.facts.intents) == {"op-3", "op-9"}
        assert link.view.facts.last_index == 9
        link.note_committed(CommittedFact(10, FACT.fact))  # no resync collected: folded into the view, not kept
        assert link.view.facts.last_index == 10 and updated.count == 1
        link._resync, link._resync_corr = ResyncCollector(), 6
        link._route(ResyncPage(0, 1, (OLDER,), ()), 6)
        assert set(link.view.facts.intents) == {"op-3"} and updated.count == 2

    trio.run(main)
