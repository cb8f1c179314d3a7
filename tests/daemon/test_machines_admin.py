"""``daemon.machines_admin``: the admin ``machines`` command's pages, cursors and refusals, and its worker-thread path
(``page_async``, for a demand item too big to sort on the loop) answering what the inline path answers."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from provisionerd.controller.view import ControllerView
from provisionerd.daemon.machines_admin import INLINE, LISTING_TTL, BadRequest, MachinesPager
from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    DemandSnapshot,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    RequestIntent,
    ResourceShape,
)
from provisionerd.planner.fact_view import FactView, fold
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import PlannerState

NOW = 1_800_000_000.0
EPOCH = Epoch(1, 1)


def _view(n: int, wanted: int) -> ControllerView:
    """``n`` idle machines of item ``d`` (idle since staggered times), the item wanting ``wanted``."""
    view = FactView()
    facts: list[CommittedFact] = []
    refs = tuple(f"ref-{i}" for i in range(n))
    facts.append(CommittedFact(1, RequestIntent("p", EPOCH, "op", "t", n, refs, ("0" * 64,) * n, "d")))
    for i, ref in enumerate(refs):
        instance = InstanceFact("p", EPOCH, "op", ref, f"m{i:05d}", "t", "0" * 64, launch_time=NOW - 3600)
        facts.append(CommittedFact(len(facts) + 1, instance))
        view.hosts[ref] = HostState(ref, "p", f"m{i:05d}", HostStatus.IDLE, NOW - 1 - (i * 7919) % 1000)
    fold(facts, view)
    demand = DemandSnapshot(1, (DemandItem("d", ResourceShape(ncpus=1), wanted),))
    return ControllerView(1, "primary", 1, view, view.hosts, demand)


def _pager(view: ControllerView | None, clock: list[float] | None = None) -> MachinesPager:
    ticks = clock if clock is not None else [0.0]
    return MachinesPager(
        lambda: view, lambda: PlannerState.initial("t"), lambda: Policy(cluster="c"), lambda: NOW, lambda: ticks[0]
    )


def _all(pager: MachinesPager, **fields: Any) -> list[dict[str, Any]]:
    lines, cursor = [], None
    while True:
        reply = pager.page({**fields, "cursor": cursor})
        lines.extend(reply["machines"])
        cursor = reply["cursor"]
        if cursor is None:
            return lines


def test_pages_cover_every_machine_once_and_the_surplus_is_the_longest_idle():
    view = _view(30, wanted=20)
    lines = _all(_pager(view), limit=7)
    assert sorted(line["machine_id"] for line in lines) == [f"m{i:05d}" for i in range(30)]
    returned = {line["machine_id"] for line in lines if line["next_reason"] == "idle"}
    longest = sorted(view.hosts.values(), key=lambda h: (h.since, h.machine_id))[:10]
    assert returned == {h.machine_id for h in longest}
    for line in lines:
        if line["machine_id"] in returned:
            assert line["next_at"] == line["idle_since"] + 300.0  # the default idle_time
        else:
            assert (line["next_action"], line["next_at"]) == ("kept", None)


def test_a_big_item_sorted_in_a_worker_thread_gives_what_the_loop_would():
    view = _view(INLINE + 500, wanted=INLINE // 2)

    async def listing() -> list[dict[str, Any]]:
        pager, lines, cursor = _pager(view), [], None
        while True:
            reply = await pager.page_async({"cursor": cursor, "limit": 1000})
            lines.extend(reply["machines"])
            cursor = reply["cursor"]
            if cursor is None:
                return lines

    threaded = trio.run(listing)
    inline = _all(_pager(view), limit=1000)
    assert threaded == inline
    assert sum(1 for line in inline if line["next_reason"] == "idle") == INLINE + 500 - INLINE // 2


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"limit": 0}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
        ({"state": "asleep"}, "state must be one of"),
        ({"provider": 3}, "provider must be a string"),
        ({"cursor": "garbage"}, "bad cursor"),
        ({"cursor": 12}, "cursor must be a string"),
        ({"cursor": "feedfacefeedface.10"}, "cursor expired or unknown"),
    ],
)
def test_bad_fields_are_refused_with_a_reason(fields, words):
    with pytest.raises(BadRequest, match=words):
        _pager(_view(3, wanted=3)).page(fields)


def test_a_cursor_expires_and_a_resync_ends_a_listing():
    clock = [0.0]
    view = _view(5, wanted=5)
    views = [view]
    pager = MachinesPager(
        lambda: views[0], lambda: PlannerState.initial("t"), lambda: Policy(cluster="c"), lambda: NOW, lambda: clock[0]
    )
    first = pager.page({"limit": 2})
    clock[0] = LISTING_TTL + 1.0
    with pytest.raises(BadRequest, match="expired"):
        pager.page({"limit": 2, "cursor": first["cursor"]})
    second = pager.page({"limit": 2})
    views[0] = _view(5, wanted=5)  # a resync builds a new view
    with pytest.raises(BadRequest, match="resynced"):
        pager.page({"limit": 2, "cursor": second["cursor"]})


def test_no_view_yet_is_said():
    with pytest.raises(BadRequest, match="no view"):
        _pager(None).page({})


def test_filters_by_provider_and_state():
    view = _view(4, wanted=4)
    assert _all(_pager(view), provider="other") == []
    assert len(_all(_pager(view), provider="p", state="idle")) == 4
    assert _all(_pager(view), state="busy") == []


def test_warm_headroom_machines_within_min_idle_are_kept_and_the_rest_shown_going():
    """``provisionerd machines`` reads the headroom rule as the planner does (``planner.headroom``): of 5 idle
    machines of ``headroom:p/t`` with ``min_idle = 3``, the 2 longest idle are shown returned, 3 kept."""
    from provisionerd.planner.headroom import Headroom

    view = FactView()
    refs = tuple(f"ref-{i}" for i in range(5))
    facts = [CommittedFact(1, RequestIntent("p", EPOCH, "op", "t", 5, refs, ("0" * 64,) * 5, "headroom:p/t"))]
    for i, ref in enumerate(refs):
        instance = InstanceFact("p", EPOCH, "op", ref, f"m{i:05d}", "t", "0" * 64, launch_time=NOW - 3600)
        facts.append(CommittedFact(len(facts) + 1, instance))
        view.hosts[ref] = HostState(ref, "p", f"m{i:05d}", HostStatus.IDLE, NOW - 1000 + i)
    fold(facts, view)
    controller = ControllerView(1, "primary", 1, view, view.hosts, DemandSnapshot(1, ()))
    policy = Policy(cluster="c", headroom=(Headroom("p", "t", 3),))
    pager = MachinesPager(
        lambda: controller, lambda: PlannerState.initial("t"), lambda: policy, lambda: NOW, lambda: 0.0
    )
    going = sorted(line["machine_id"] for line in _all(pager) if line["next_reason"] == "idle")
    assert going == ["m00000", "m00001"]
