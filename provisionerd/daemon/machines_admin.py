"""The admin socket's ``machines`` command (``provisionerd machines``): every machine the daemon tracks, paged.

Request: ``{"cmd": "machines", "cursor": C, "limit": K, "provider": P, "state": S}`` (all optional). Reply:
``{"ok": true, "machines": [...], "cursor": C2 | null, "total": N, "now": wall seconds}``; ``cursor`` null: the
last page. Each machine is a :class:`MachineLine` as a JSON object.

Cost: the first page takes the list of the view's machine ids (one C-level copy: ~1 ms at 100,000) under a random
token; each page then reads at most ``limit`` machines (and scans at most ``MAX_SCAN`` ids) by offset into that
list (a machine gone since is skipped, one added since is on the next listing). Nothing walks the whole fleet on
the loop, so a page costs what its machines cost, whatever the fleet's size (``bench/machines.py``). What grows
with the fleet is done once per listing, in a worker thread when big (``page_async``), from copies the loop takes
in C: the demand's wanted counts, and a demand item's surplus (which of its idle machines the plan gives away,
:func:`provisionerd.planner.outlook.item_surplus`: a chunked sort of the item's joined, not busy machines).
At most ``MAX_LISTINGS`` listings are kept, each for ``LISTING_TTL`` seconds: an older cursor is refused as expired.

The next action on each machine is :func:`provisionerd.planner.outlook.outlook`: the planner's rules, read with the
planner's own state (``machine_seen``, ``drain_seen``, in-flight returns) and the policy in force.
"""

from __future__ import annotations

import secrets
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from provisionerd.controller.view import ControllerView
from provisionerd.daemon.admin_socket import Command
from provisionerd.domain.model import DemandSnapshot, HostState, HostStatus
from provisionerd.planner import headroom
from provisionerd.planner.fact_view import MachineRecord, MachineState
from provisionerd.planner.host_table import HostTable
from provisionerd.planner.in_flight import NOTHING_IN_FLIGHT, InFlight
from provisionerd.planner.outlook import item_surplus, outlook
from provisionerd.planner.policy import Policy
from provisionerd.planner.rejoin import SETTLED, Rejoin, Window
from provisionerd.planner.state import PlannerState

DEFAULT_LIMIT = 250
MAX_LIMIT = 1000
MAX_LISTINGS = 8
LISTING_TTL = 600.0
#: Machine ids a page reads at most (a filter that matches few machines returns a short page and a cursor).
MAX_SCAN = 8000
#: A demand item's machines sorted on the loop at most (more: in a worker thread); a snapshot's items likewise.
INLINE = 2000
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
    #: The instance type it really got, when its plugin said (a template may list several); "" otherwise.
    instance_type: str = ""


class BadRequest(ValueError):
    """A request field the command cannot use; its message says which and why."""


@attrs.define
class _Listing:
    view: weakref.ref[ControllerView]
    ids: list[str]
    created: float
    #: demand_id -> the machine ids the plan gives away once idle (once per listing, when a page first shows one).
    surplus: dict[str, frozenset[str]] = attrs.field(factory=dict)
    wanted: Mapping[str, int] | None = None  # demand_id -> wanted count (read once per listing)
    wanted_read: bool = False


@attrs.frozen
class _Chosen:
    """What one page shows: the listing's window up to ``end`` and the machine ids in it that pass the filters."""

    token: str
    end: int
    listing: _Listing
    view: ControllerView
    picked: list[str]


def wanted_by_item(demand: DemandSnapshot | None) -> Mapping[str, int] | None:
    """demand_id -> wanted count of ``demand`` (``None``: no snapshot: the plan gives nothing away for idling)."""
    if demand is None:
        return None
    wanted: dict[str, int] = {}
    for item in demand.items:
        wanted[item.demand_id] = wanted.get(item.demand_id, 0) + max(item.count, 0)
    return wanted


def _in_flight(machine: MachineRecord, in_flight: InFlight) -> str:
    machine_id = machine.machine_id
    return "return" if machine_id in in_flight.returns else "lost" if machine_id in in_flight.lost else ""


def state_of(machine: MachineRecord, host: HostState | None, in_flight: str) -> str:
    """The machine's state as listed: ``lost``, ``returning``, ``booting`` (no host yet) or its host's status."""
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
        rejoin: Callable[[], Rejoin] = lambda: SETTLED,
        in_flight: Callable[[], InFlight] = lambda: NOTHING_IN_FLIGHT,
    ) -> None:
        self._view, self._state, self._policy, self._wall, self._clock = view, state, policy, wall, clock
        #: The actions under way (the op book's: ``Operations.in_flight``), read at each page.
        self._in_flight_now = in_flight
        #: The loop's settle window after the last (re)join (``ReconcileLoop.rejoin``; planner.rejoin).
        self._rejoin = rejoin
        self._listings: OrderedDict[str, _Listing] = OrderedDict()

    def page(self, request: dict[str, Any]) -> dict[str, Any]:
        """One page (the reply document), every part computed here; ``BadRequest`` on a bad field or an unknown or
        expired cursor. The admin command runs ``page_async``, which moves the big parts to a worker thread."""
        chosen = self._select(request)
        listing = chosen.listing
        if not listing.wanted_read:
            listing.wanted, listing.wanted_read = wanted_by_item(chosen.view.demand), True
        for demand_id in self._needed(chosen):
            listing.surplus[demand_id] = self._surplus_job(chosen.view, demand_id, listing.wanted)[1]()
        return self._finish(chosen)

    async def page_async(self, request: dict[str, Any]) -> dict[str, Any]:
        """``page``, with the parts that grow with the fleet (the demand's wanted counts, a big item's surplus)
        computed in a worker thread from copies taken on the loop, so the event loop never waits for them (the
        sort is chunked: the thread gives the interpreter back between chunks)."""
        chosen = self._select(request)
        listing = chosen.listing
        if not listing.wanted_read:
            demand = chosen.view.demand
            big = demand is not None and len(demand.items) > INLINE
            listing.wanted = await trio.to_thread.run_sync(wanted_by_item, demand) if big else wanted_by_item(demand)
            listing.wanted_read = True
        for demand_id in self._needed(chosen):
            size, job = self._surplus_job(chosen.view, demand_id, listing.wanted)
            listing.surplus[demand_id] = await trio.to_thread.run_sync(job) if size > INLINE else job()
        return self._finish(chosen)

    def _select(self, request: dict[str, Any]) -> _Chosen:
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
        in_flight = self._in_flight_now()
        machines, hosts = view.facts.machines, view.hosts
        picked: list[str] = []
        end = offset
        stop = min(len(listing.ids), offset + MAX_SCAN)
        while end < stop and len(picked) < limit:
            machine = machines.get(listing.ids[end])
            end += 1
            if machine is None or not machine.state.live and machine.state is not MachineState.LOST:
                continue  # returned since the listing was taken
            if provider is not None and machine.provider != provider:
                continue
            if wanted_state is not None:
                kind = state_of(machine, hosts.get(machine.instance_ref), _in_flight(machine, in_flight))
                if kind != wanted_state:
                    continue
            picked.append(machine.machine_id)
        return _Chosen(token, end, listing, view, picked)

    def _needed(self, chosen: _Chosen) -> list[str]:
        """The demand items of the page's joined, not busy machines whose surplus is not known yet."""
        machines, hosts, known = chosen.view.facts.machines, chosen.view.hosts, chosen.listing.surplus
        needed: dict[str, None] = {}
        for machine_id in chosen.picked:
            machine = machines.get(machine_id)
            if machine is None or machine.demand_id in known:
                continue
            host = hosts.get(machine.instance_ref)
            if host is not None and host.status in (HostStatus.JOINED, HostStatus.IDLE):
                needed[machine.demand_id] = None
        return list(needed)

    def _surplus_job(
        self, view: ControllerView, demand_id: str, wanted: Mapping[str, int] | None
    ) -> tuple[int, Callable[[], frozenset[str]]]:
        """The size of ``demand_id``'s group of joined, not busy machines, and a function computing which of them
        the plan gives away (``planner.outlook.item_surplus``) from copies taken now: safe to run in a thread."""
        if wanted is None:
            return 0, frozenset  # demand unknown: the plan returns nothing for being idle
        state, policy, now = self._state(), self._policy(), self._wall()
        facts = view.facts
        machines = facts.machines
        skip = self._in_flight_now().retiring
        active = facts.active_by_demand.get(demand_id, 0) - sum(
            1  # the planner's own count: its actions under way on machines still active (InFlight.unseen)
            for m in skip
            if m in machines and machines[m].demand_id == demand_id and machines[m].state is MachineState.ACTIVE
        )
        group = _available(view, demand_id)
        drained = [m for m in facts.drained.values() if m.demand_id == demand_id]
        drained_hosts = {m.instance_ref: h for m in drained if (h := view.hosts.get(m.instance_ref)) is not None}
        machine_seen, drain_seen, count = state.machine_seen, state.drain_seen, wanted.get(demand_id, 0)
        if headroom.is_headroom(demand_id):  # a warm headroom item: its min_idle are kept (planner.headroom)
            count = sum(rule.wanted_at(now) for rule in policy.headroom if rule.demand_id == demand_id)

        def job() -> frozenset[str]:
            hosts = {**drained_hosts, **{m.instance_ref: h for h, m in group}}  # in the thread: a loop over the group
            return frozenset(
                item_surplus(
                    group,
                    drained,
                    hosts,
                    active=active,
                    wanted=count,
                    skip=skip,
                    machine_seen=machine_seen,
                    drain_seen=drain_seen,
                    now=now,
                    policy=policy,
                )
            )

        return len(group), job

    def _finish(self, chosen: _Chosen) -> dict[str, Any]:
        view, listing = chosen.view, chosen.listing
        now, state, policy, in_flight = self._wall(), self._state(), self._policy(), self._in_flight_now()
        machines, hosts = view.facts.machines, view.hosts
        # The plan's own window (ReconcileLoop.cycle): the machines known to have joined are the view's; its count
        # of missing machines is not read here (``settled_for``, ``until`` and ``reason`` need none).
        rejoin = attrs.evolve(self._rejoin(), joined_before=view.joined)
        window = Window(rejoin, {}, now, lambda provider: policy.of(provider).rejoin_settle)
        lines = []
        for machine_id in chosen.picked:
            machine = machines.get(machine_id)
            if machine is not None:
                host = hosts.get(machine.instance_ref)
                line = self._line(machine, host, listing, state, in_flight, policy, now, window, view.facts.open_ops)
                lines.append(attrs.asdict(line))
        more = chosen.end < len(listing.ids)
        if not more:
            self._listings.pop(chosen.token, None)
        return {
            "ok": True,
            "machines": lines,
            "cursor": f"{chosen.token}.{chosen.end}" if more else None,
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
        listing: _Listing,
        state: PlannerState,
        under_way: InFlight,
        policy: Policy,
        now: float,
        window: Window,
        open_ops: Mapping[str, None],
    ) -> MachineLine:
        machine_id = machine.machine_id
        in_flight = _in_flight(machine, under_way)
        kind = state_of(machine, host, in_flight)
        available = host is not None and host.status in (HostStatus.JOINED, HostStatus.IDLE)
        surplus = available and kind in ("joined", "idle") and machine_id in listing.surplus.get(machine.demand_id, ())
        seen = outlook(
            machine,
            host,
            policy.of(machine.provider),
            now,
            machine_seen=state.machine_seen,
            drain_seen=state.drain_seen,
            surplus=surplus,
            in_flight=in_flight,
            window=window,
            intent_seen=state.intent_seen.get(machine.op_id, now) if machine.op_id in open_ops else None,
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
            instance_type=machine.instance_type,
        )

    def command(self) -> Command:
        async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
            try:
                return await self.page_async(request)
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
