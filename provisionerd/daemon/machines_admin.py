"""The admin socket's ``machines`` command (``provisionerd machines``): every machine the daemon tracks, paged.

Request: ``{"cmd": "machines", "cursor": C, "limit": K, "provider": P, "state": S}`` (all optional). Reply:
``{"ok": true, "machines": [...], "cursor": C2 | null, "total": N, "now": wall seconds}``; ``cursor`` null: the
last page. Each machine is a :class:`MachineLine` as a JSON object.

Cost: the first page takes the list of the view's machine ids (one C-level copy: ~1 ms at 100,000) under a random
token; each page then reads at most ``limit`` machines by offset into that list (a machine gone since is skipped,
one added since is on the next listing). Nothing walks the whole fleet in a page, so a page costs what its
machines cost, whatever the fleet's size (measured by ``bench/machines.py``). The one exception is the surplus of
a demand item (which of its idle machines the plan gives away, :func:`provisionerd.planner.outlook.surplus_ranks`):
it sorts that item's joined, not busy machines once per listing, when a page first shows one of them.
At most ``MAX_LISTINGS`` listings are kept, each for ``LISTING_TTL`` seconds: an older cursor is refused as expired.

The next action on each machine is :func:`provisionerd.planner.outlook.outlook`: the planner's rules, read with the
planner's own state (``machine_seen``, ``drain_seen``, in-flight returns) and the policy in force.
"""

from __future__ import annotations

import secrets
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Set
from typing import Any

import attrs

from provisionerd.controller.view import ControllerView
from provisionerd.daemon.admin_socket import Command
from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner import drain
from provisionerd.planner.fact_view import MachineRecord, MachineState
from provisionerd.planner.host_table import HostTable
from provisionerd.planner.outlook import launched_at, outlook, surplus_ranks
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import PlannerState

DEFAULT_LIMIT = 500
MAX_LIMIT = 2000
MAX_LISTINGS = 8
LISTING_TTL = 600.0
#: Machine ids a page reads at most (a filter that matches few machines returns a short page and a cursor).
MAX_SCAN = 8000
#: The machine states ``--state`` accepts (``state`` of a line).
STATES = ("booting", "joined", "idle", "busy", "lost", "returning")


@attrs.frozen
class MachineLine:
    """One machine as ``provisionerd machines`` shows it. Times are wall seconds (``None``: unknown)."""

    machine_id: str
    provider: str
    template: str
    demand_id: str
    state: str  # one of STATES
    joined: bool
    activity: str  # "busy", "idle" or "" (not joined, or in flight)
    launched_at: float | None
    age_s: float | None
    idle_since: float | None
    op_id: str
    next_action: str  # Outlook.action
    next_at: float | None
    next_reason: str
    next_rule: str


class BadRequest(ValueError):
    """A request field the command cannot use; its message says which and why."""


@attrs.define
class _Listing:
    view: weakref.ref[ControllerView]
    ids: list[str]
    created: float
    surplus: dict[str, set[str]] = attrs.field(factory=dict)  # demand_id -> machine ids the plan gives away
    aged: _Aged | None = None


@attrs.frozen
class _Aged:
    out: frozenset[str]  # past max_ttl and returned or draining: not counted as supply
    past: frozenset[str]  # every machine past max_ttl (never idle-listed)


def state_of(machine: MachineRecord, host: HostState | None, in_flight: str) -> str:
    if machine.state is MachineState.LOST or in_flight == "lost":
        return "lost"
    if machine.state is not MachineState.ACTIVE or in_flight == "return":
        return "returning"
    if host is None:
        return "booting"
    return host.status.value


class MachinesPager:
    """Pages of ``MachineLine`` over the daemon's live view; see the module docstring. ``view``, ``state`` and
    ``policy`` are read at each page (the view a resync replaces, the planner state the loop replaces)."""

    def __init__(
        self,
        view: Callable[[], ControllerView | None],
        state: Callable[[], PlannerState],
        policy: Callable[[], Policy],
        wall: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._view, self._state, self._policy, self._wall, self._clock = view, state, policy, wall, clock
        self._listings: OrderedDict[str, _Listing] = OrderedDict()

    def page(self, request: dict[str, Any]) -> dict[str, Any]:
        """One page (the reply document); ``BadRequest`` on a bad field or an unknown or expired cursor."""
        limit = request.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(f"limit must be an integer from 1 to {MAX_LIMIT}")
        provider, wanted_state = request.get("provider"), request.get("state")
        if provider is not None and not isinstance(provider, str):
            raise BadRequest("provider must be a string")
        if wanted_state is not None and wanted_state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}")
        view = self._view()
        if view is None:
            raise BadRequest("the daemon has no view of the controller yet (not joined and resynced)")
        token, offset, listing = self._listing(request.get("cursor"), view)
        now = self._wall()
        state, policy = self._state(), self._policy()
        machines, hosts = view.facts.machines, view.hosts
        lines: list[dict[str, Any]] = []
        end = offset
        stop = min(len(listing.ids), offset + MAX_SCAN)
        while end < stop and len(lines) < limit:
            machine = machines.get(listing.ids[end])
            end += 1
            if machine is None or not machine.state.live and machine.state is not MachineState.LOST:
                continue  # returned since the listing was taken
            if provider is not None and machine.provider != provider:
                continue
            line = self._line(machine, hosts.get(machine.instance_ref), view, listing, state, policy, now)
            if wanted_state is None or line.state == wanted_state:
                lines.append(attrs.asdict(line))
        more = end < len(listing.ids)
        if not more:
            self._listings.pop(token, None)
        return {
            "ok": True,
            "machines": lines,
            "cursor": f"{token}.{end}" if more else None,
            "total": len(listing.ids),
            "now": now,
        }

    def _listing(self, cursor: object, view: ControllerView) -> tuple[str, int, _Listing]:
        clock = self._clock()
        for token, kept in list(self._listings.items()):
            if clock - kept.created > LISTING_TTL or kept.view() is None:
                del self._listings[token]
        if cursor is None or cursor == "":
            while len(self._listings) >= MAX_LISTINGS:
                self._listings.popitem(last=False)
            token = secrets.token_hex(8)
            listing = self._listings[token] = _Listing(weakref.ref(view), list(view.facts.machines), clock)
            return token, 0, listing
        if not isinstance(cursor, str):
            raise BadRequest("cursor must be a string (the cursor a previous page returned)")
        token, dot, offset_text = cursor.partition(".")
        if not dot or not offset_text.isdigit() or len(offset_text) > 12:
            raise BadRequest(f"bad cursor {cursor[:40]!r}: use the cursor a previous page returned")
        found = self._listings.get(token)
        if found is None:
            raise BadRequest("cursor expired or unknown (a listing is kept 10 minutes): start again without one")
        if found.view() is not view:
            self._listings.pop(token, None)
            raise BadRequest("the daemon resynced since the first page: start again without a cursor")
        return token, min(int(offset_text), len(found.ids)), found

    def _line(
        self,
        machine: MachineRecord,
        host: HostState | None,
        view: ControllerView,
        listing: _Listing,
        state: PlannerState,
        policy: Policy,
        now: float,
    ) -> MachineLine:
        machine_id = machine.machine_id
        in_flight = (
            "return" if machine_id in state.pending_returns else "lost" if machine_id in state.pending_lost else ""
        )
        kind = state_of(machine, host, in_flight)
        available = host is not None and host.status in (HostStatus.JOINED, HostStatus.IDLE)
        surplus = (
            available and kind in ("joined", "idle") and machine_id in self._surplus(machine, view, listing, state)
        )
        seen = outlook(
            machine,
            host,
            policy.of(machine.provider),
            now,
            machine_seen=state.machine_seen,
            drain_seen=state.drain_seen,
            surplus=surplus,
            in_flight=in_flight,
        )
        launched = machine.launch_time if machine.launch_time > 0 else None
        return MachineLine(
            machine_id=machine_id,
            provider=machine.provider,
            template=machine.template_id,
            demand_id=machine.demand_id,
            state=kind,
            joined=host is not None,
            activity="busy" if kind == "busy" else "idle" if kind in ("joined", "idle") else "",
            launched_at=launched,
            age_s=None if launched is None else round(max(now - launched, 0.0), 3),
            idle_since=host.since if host is not None and available else None,
            op_id=machine.op_id,
            next_action=seen.action,
            next_at=seen.at,
            next_reason=seen.reason,
            next_rule=seen.rule,
        )

    def _surplus(
        self, machine: MachineRecord, view: ControllerView, listing: _Listing, state: PlannerState
    ) -> set[str]:
        demand_id = machine.demand_id
        found = listing.surplus.get(demand_id)
        if found is not None:
            return found
        found = listing.surplus[demand_id] = set()
        if view.demand is None:
            return found  # demand unknown: the plan returns nothing for being idle
        wanted = sum(max(item.count, 0) for item in view.demand.items if item.demand_id == demand_id)
        facts, skip = view.facts, state.pending_returns.keys() | state.pending_lost.keys()
        machines = facts.machines
        active = facts.active_by_demand.get(demand_id, 0) - sum(
            1  # the planner's own count: its pending actions on machines still active (planner.plan._settle)
            for m in skip
            if m in machines and machines[m].demand_id == demand_id and machines[m].state is MachineState.ACTIVE
        )
        aged = self._aged(view, listing, state, skip)
        active -= sum(1 for m in aged.out if machines[m].demand_id == demand_id)
        group = _available(view, demand_id)
        entries = [(host.since, m.machine_id) for host, m in group if m.machine_id not in skip | aged.past]
        found.update(surplus_ranks(entries, active - wanted))
        return found

    def _aged(self, view: ControllerView, listing: _Listing, state: PlannerState, skip: Set[str]) -> _Aged:
        """The machines past their provider's ``max_ttl`` (``planner.drain.aged``, the planner's own pass: it costs
        what the plan's costs), once per listing: those returned or draining are not supply, and none is idle-listed."""
        if listing.aged is None:
            policy, now = self._policy(), self._wall()
            if not policy.any_max_ttl:
                listing.aged = _Aged(frozenset(), frozenset())
            else:
                seen = self._state().machine_seen
                found = drain.aged(
                    view.facts.active_refs,
                    view.hosts,
                    skip,
                    lambda m: launched_at(m, seen, now),
                    state.drain_seen,
                    now,
                    policy,
                )
                out = frozenset((*(m.machine_id for _, m in found.retire), *(m.machine_id for m in found.draining)))
                listing.aged = _Aged(out, out | {m.machine_id for m in found.drain})
        return listing.aged

    def command(self) -> Command:
        async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
            try:
                return self.page(request)
            except BadRequest as exc:
                return {"ok": False, "error": str(exc)}

        return Command(run=run, timeout=lambda _request: 5.0)


def _available(view: ControllerView, demand_id: str) -> list[tuple[HostState, MachineRecord]]:
    """The joined, not busy, active machines of ``demand_id`` with their hosts (the planner's join index)."""
    hosts, active_refs = view.hosts, view.facts.active_refs
    table = hosts.indexes(active_refs) if isinstance(hosts, HostTable) else None
    if table is not None:
        return list(table.available.get(demand_id, {}).values())
    found = []
    for ref, machine in active_refs.items():
        host = hosts.get(ref)
        if machine.demand_id == demand_id and host is not None and host.status in (HostStatus.JOINED, HostStatus.IDLE):
            found.append((host, machine))
    return found
