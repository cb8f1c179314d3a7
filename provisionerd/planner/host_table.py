"""Hosts by instance_ref, joined against the fact view's active machines, with the indexes a plan pass reads.

Each plan pass needs the active machines that have not joined (no host: they may be past the join deadline) and
the joined ones whose host is neither busy nor lost (they may retire or be given to another item). Finding them by
scanning every host and machine costs ~35 ms at 100,000 machines, and grows faster than the count once the data
no longer fits the CPU cache. :class:`HostTable` keeps both sets up to date on every host change and, through the
:class:`~provisionerd.planner.fact_view.FactView` that owns it, on every machine change; not-joined machines are
also kept by launch time, so a pass reads only those past the join deadline, not every booting one.

``FactView.hosts`` is the table bound to a view; it is a ``MutableMapping`` (``table[ref] = host``,
``del table[ref]``), so a holder that treats it as its dict of hosts keeps the indexes right. For any other
mapping of hosts, :func:`join_index` builds the same sets in one pass over hosts and machines.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING

import attrs

from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner.offers import OfferKey

if TYPE_CHECKING:
    from provisionerd.planner.fact_view import MachineRecord

#: Distinct capability reports a table shares between its hosts (most hosts of a template send the same report);
#: a report beyond them is kept as it came.
SHARED_REPORTS = 4096

#: A host the planner may act on: joined and not running work (status neither BUSY nor LOST).
Placed = tuple[HostState, "MachineRecord"]

#: A joined machine whose host is available: ``(idle since, machine_id, record)`` sorts longest idle first, ties by
#: machine id (machine ids are unique, so records are never compared).
IdleEntry = tuple[float, str, "MachineRecord"]


def _idle_entries(group: Mapping[str, Placed]) -> list[IdleEntry]:
    """One demand item's available hosts as idle entries, longest idle first."""
    entries = [(host.since, machine.machine_id, machine) for host, machine in group.values()]
    entries.sort()
    return entries


def _available(host: HostState) -> bool:
    # BUSY machines are never returned; LOST hosts belong to the orphan classifier's ghost rule.
    return host.status is not HostStatus.BUSY and host.status is not HostStatus.LOST


class JoinIndex:
    """What a plan pass reads about joins, built for one plain mapping of hosts (see :func:`join_index`).

    ``available``: demand_id -> instance_ref -> ``(host, machine)`` for active machines whose host is neither busy
    nor lost. The ``unjoined_*`` methods name active machines with no host ("active machine" meaning the one
    ``FactView.active_refs`` names for its ref). :class:`HostTable` answers the same questions from kept indexes.
    """

    def __init__(
        self,
        unjoined: Mapping[str, MachineRecord],
        available: Mapping[str, Mapping[str, Placed]],
        reprobed_busy: Mapping[str, Placed] | None = None,
    ):
        self.unjoined, self.available = unjoined, available
        self._by_op: dict[str, list[MachineRecord]] | None = None
        self._reprobed_busy: Mapping[str, Placed] = reprobed_busy or {}

    def unjudged(self, verdicts: object) -> list[tuple[str, Placed]]:
        """The available hosts (a report that says nothing is judged too: it confirms nothing): built here, every
        one of them (see :meth:`HostTable.unjudged` for the kept index)."""
        return [(ref, placed) for by_ref in self.available.values() for ref, placed in by_ref.items()]

    def judged(self, ref: str, host: HostState) -> None:
        """Nothing is kept here (:meth:`HostTable.judged`)."""

    def idle_entries(self, demand_id: str) -> Sequence[IdleEntry]:
        """``demand_id``'s available hosts as idle entries, longest idle first: built here (see
        :meth:`HostTable.idle_entries` for the kept ones). Read only."""
        group = self.available.get(demand_id)
        return _idle_entries(group) if group else ()

    def idle_offer(self, demand_id: str) -> OfferKey | None:
        """Not known here (``None``): see :meth:`HostTable.idle_offer`."""
        return None

    def reprobed_busy(self) -> list[tuple[str, Placed]]:
        """Busy hosts of active machines whose report came from a re-probe (``HostState.probed_at``), built here."""
        return list(self._reprobed_busy.items())

    def unjoined_of(self, op_id: str) -> list[MachineRecord]:
        """Not joined, created for ``op_id``."""
        if self._by_op is None:  # grouped once: a pass may ask for several timed-out intents
            self._by_op = {}
            for machine in self.unjoined.values():
                self._by_op.setdefault(machine.op_id, []).append(machine)
        return self._by_op.get(op_id, [])

    def unjoined_launched_by(self, cutoff: float) -> list[MachineRecord]:
        """Not joined, launch time known (``> 0``) and at most ``cutoff`` (a superset is allowed: callers recheck)."""
        return [m for m in self.unjoined.values() if 0 < m.launch_time <= cutoff]

    def unjoined_unknown_launch(self) -> list[MachineRecord]:
        """Not joined, launch time unknown (not ``> 0``)."""
        return [m for m in self.unjoined.values() if not m.launch_time > 0]

    def earliest_unjoined_launch_after(self, cutoff: float) -> float | None:
        """The earliest known launch time after ``cutoff`` of a machine not joined (``None``: there is none). One
        pass here (a plain mapping of hosts, as in tests); :class:`HostTable` answers from its heap."""
        return min((m.launch_time for m in self.unjoined.values() if m.launch_time > cutoff), default=None)


class HostTable(MutableMapping[str, HostState]):
    """The latest :class:`HostState` per instance_ref, with the join indexes against ``active_refs``.

    ``active_refs`` is the owning view's index (instance_ref -> ACTIVE machine); the view calls
    :meth:`machine_added` / :meth:`machine_removed` whenever a ref enters or leaves it, and every host write goes
    through this mapping, so the indexes never need a rescan. A host must be stored under its own instance_ref.

    Not-joined machines are kept three ways, because a pass asks three questions: by op_id (an intent that timed
    out), by launch time (a min-heap: only machines past the join deadline are read, not every booting one), and
    those of unknown launch time (counted from first seen, so each is read every pass, as before).
    """

    def __init__(self, active_refs: Mapping[str, MachineRecord]) -> None:
        self._hosts: dict[str, HostState] = {}
        self._active = active_refs
        self._unjoined: dict[str, MachineRecord] = {}
        self._unjoined_by_op: dict[str, dict[str, MachineRecord]] = {}
        self._unknown_launch: dict[str, MachineRecord] = {}
        # Not-joined machines with a known launch time, each its own heap entry (``MachineRecord`` orders by launch
        # time, then instance_ref and machine id: no tuple per machine, 7 MB at 100k not joined). Entries of
        # machines that joined since are left in place (removing from a heap's middle is O(n)) and dropped when
        # read; once they outnumber the live ones the heap is rebuilt, so a bulk join (a resync's hosts) costs
        # O(n) once.
        self._deadlines: list[MachineRecord] = []
        self._stale = 0
        self._available: dict[str, dict[str, Placed]] = {}
        # Every active machine by launch time, joined or not (``planner.drain``: only those past the shortest
        # ``max_ttl`` are read), kept the same way: stale entries dropped when read, rebuilt when they outnumber.
        # Built at the first drain pass (``None`` until then): a fleet with no ``max_ttl`` pays no memory for it
        # (~1 MB at 100k).
        self._aging: list[MachineRecord] | None = None
        self._aging_stale = 0
        self._aging_unknown: dict[str, MachineRecord] = {}
        # Hosts with a reclaim notice (``HostState.noticed``; planner.drain): few, read every pass.
        self._noticed: dict[str, HostState] = {}
        # Available hosts that have not passed the capability check (planner.health) in
        # their present state against the verdicts of ``_judged_against``: the only ones a pass judges (issue 36: a
        # pass over every available host cost 4 ms of a 5.5 ms plan at 100k machines with 25k idle hosts). A host
        # enters when it is placed (a new state, or its machine came), leaves when it passes or is no longer
        # available; another verdict cache (a new catalog) starts it over from every available host.
        self._unjudged: dict[str, Placed] = {}
        self._judged_against: object | None = None
        # Entries deleted from ``_unjudged`` since it was last compacted: a dict never shrinks on deletion, and
        # iterating one walks every slot it ever used (after a resync's first pass judged 250,000 idle hosts, an
        # empty ``_unjudged`` cost 0.3 ms a pass to list). Compacted when the holes outnumber the entries.
        self._unjudged_holes = 0
        # demand_id -> its available hosts as idle entries, sorted (``idle_entries``): built when a pass first reads
        # the group (only items that give machines away are read), dropped whenever the group changes. A pass
        # then copies a list instead of reading every host and machine of the group and sorting them again (at 1M
        # tracked machines that read, each host and record a cache miss, cost 4 of a 22 ms pass).
        # With the entries, the one offer all of the group's machines are of (``None``: several), so that the pass
        # can give an item's surplus as one slice (``allocate.excess_pool``).
        self._idle: dict[str, tuple[list[IdleEntry], OfferKey | None]] = {}
        # Busy hosts whose report came from a re-probe after the join (``HostState.probed_at``; planner.health's
        # health after join): judged every pass, few (a fleet re-probes, but only changed reports are sent).
        self._reprobed_busy: dict[str, Placed] = {}
        # Capability reports by content (``_shared``): most hosts of a template report the same.
        self._reports: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
        for machine in active_refs.values():
            self._unjoin(machine)

    def indexes(self, active_refs: Mapping[str, MachineRecord]) -> HostTable | None:
        """This table as the join index if it is joined against ``active_refs`` (the same dict), else ``None``."""
        return self if active_refs is self._active else None

    # --- the join index (the same questions as JoinIndex) ---------------------------------------------------------

    @property
    def unjoined(self) -> Mapping[str, MachineRecord]:
        return self._unjoined

    @property
    def available(self) -> Mapping[str, Mapping[str, Placed]]:
        return self._available

    def unjoined_of(self, op_id: str) -> list[MachineRecord]:
        return list(self._unjoined_by_op.get(op_id, {}).values())

    def unjoined_unknown_launch(self) -> list[MachineRecord]:
        return list(self._unknown_launch.values())

    def unjoined_launched_by(self, cutoff: float) -> list[MachineRecord]:
        """Pops the heap up to ``cutoff`` and pushes back the entries still live: the content never changes, so a
        pass stays a pure function of the table; it costs O(k log n) for the k machines it returns."""
        heap, unjoined = self._deadlines, self._unjoined
        if self._stale > len(heap) // 2 + 64:
            self._rebuild_deadlines()
        found: dict[str, MachineRecord] = {}
        while heap and heap[0].launch_time <= cutoff:
            entry = heapq.heappop(heap)
            ref = entry.instance_ref
            if unjoined.get(ref) is entry and ref not in found:
                found[ref] = entry
            else:
                self._stale -= 1  # joined or left since, or a second entry for the same machine
        for machine in found.values():
            heapq.heappush(heap, machine)
        return list(found.values())

    def earliest_unjoined_launch_after(self, cutoff: float) -> float | None:
        """The earliest known launch time after ``cutoff`` of a machine not joined (``None``: there is none). Like
        :meth:`unjoined_launched_by`, it pops the entries up to ``cutoff`` and pushes the live ones back (O(k log n)
        for the k machines launched by then, which a pass reads anyway); entries of machines that joined or left
        since are dropped on the way."""
        unjoined = self._unjoined
        found, dropped = _earliest_live_after(self._deadlines, cutoff, lambda m: unjoined.get(m.instance_ref) is m)
        self._stale -= dropped
        return found

    def _rebuild_deadlines(self) -> None:
        self._deadlines = [m for m in self._unjoined.values() if m.launch_time > 0]
        heapq.heapify(self._deadlines)
        self._stale = 0

    # --- the mapping ---------------------------------------------------------------------------------------------

    def __getitem__(self, ref: str) -> HostState:
        return self._hosts[ref]

    def __contains__(self, ref: object) -> bool:  # the dict's own lookup, not Mapping's try/except
        return ref in self._hosts

    def get(self, ref: str, default: HostState | None = None) -> HostState | None:  # type: ignore[override]
        """The dict's own ``get``: Mapping's goes through ``__getitem__`` and a ``KeyError`` for each missing ref
        (0.7 against 0.05 us; an orphan pass asks once per listed machine, ``orphans.sift``)."""
        return self._hosts.get(ref, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def __repr__(self) -> str:
        return f"HostTable({self._hosts!r})"

    def __setitem__(self, ref: str, host: HostState) -> None:
        if ref != host.instance_ref:
            raise ValueError(f"host {host.instance_ref!r} stored under another instance_ref {ref!r}")
        machine = self._active.get(ref)
        host = self._shared(host, machine)
        ref = host.instance_ref
        self._hosts[ref] = host
        if host.noticed:
            self._noticed[ref] = host
        else:
            self._noticed.pop(ref, None)
        if machine is not None:
            self._join(machine)
            self._place(ref, host, machine)

    def _shared(self, host: HostState, machine: MachineRecord | None) -> HostState:
        """``host`` as the table keeps it: its strings the very objects its machine's record holds (where equal) and
        its capability report the one object kept for an equal report (``SHARED_REPORTS``). A host comes decoded
        from a frame with its own copy of each, and at 100,000 joined machines those copies cost ~45 MB
        (``bench/joined.py``). Equal in every field to ``host``; ``host`` itself when there is nothing to share."""
        report = host.capabilities
        if report:
            key = tuple(report.items())
            kept = self._reports.get(key)
            if kept is None and len(self._reports) < SHARED_REPORTS:
                kept = self._reports[key] = report
            if kept is not None:
                report = kept
        if machine is None:
            return host if report is host.capabilities else attrs.evolve(host, capabilities=report)
        ref, machine_id, hostname, address = host.instance_ref, host.machine_id, host.hostname, host.address
        ref = machine.instance_ref if ref == machine.instance_ref else ref
        machine_id = machine.machine_id if machine_id == machine.machine_id else machine_id
        hostname = machine.hostname if hostname == machine.hostname else hostname
        address = machine.address if address == machine.address else address
        if (
            ref is host.instance_ref
            and machine_id is host.machine_id
            and hostname is host.hostname
            and address is host.address
            and report is host.capabilities
        ):
            return host
        return attrs.evolve(
            host, instance_ref=ref, machine_id=machine_id, hostname=hostname, address=address, capabilities=report
        )

    def __delitem__(self, ref: str) -> None:
        del self._hosts[ref]
        self._noticed.pop(ref, None)
        machine = self._active.get(ref)
        if machine is not None:
            self._unplace(ref, machine)
            self._unjoin(machine)

    def noticed(self) -> list[HostState]:
        """The hosts with a reclaim notice (``HostState.noticed``), from the kept index."""
        return list(self._noticed.values())

    # --- the capability check's candidates (planner.health) --------------------------------------------------------

    def unjudged(self, verdicts: object) -> list[tuple[str, Placed]]:
        """The available hosts, less those that passed in their present state since
        ``verdicts`` (the check's cache, ``Catalog.verdicts``) was first asked for; the same hosts as
        :meth:`JoinIndex.unjudged` but those :meth:`judged` passed, which the cache would skip anyway."""
        if verdicts is not self._judged_against:
            self._judged_against = verdicts
            self._unjudged = {ref: placed for by_ref in self._available.values() for ref, placed in by_ref.items()}
            self._unjudged_holes = 0
        elif self._unjudged_holes > len(self._unjudged) + 64:
            self._unjudged = dict(self._unjudged)  # the same entries in the same order, without the holes
            self._unjudged_holes = 0
        return list(self._unjudged.items())

    def judged(self, ref: str, host: HostState) -> None:
        """``host`` (the state now stored for ``ref``) passed the check: not a candidate until it changes."""
        placed = self._unjudged.get(ref)
        if placed is not None and placed[0] is host:
            del self._unjudged[ref]
            self._unjudged_holes += 1

    # --- the idle entries of a demand item (planner.supply's idle lists) -------------------------------------------

    def idle_entries(self, demand_id: str) -> Sequence[IdleEntry]:
        """``demand_id``'s available hosts (``available[demand_id]``) as ``(host.since, machine_id, machine)``,
        longest idle first, ties by machine id: kept until the group changes. Read only (copy it to change it)."""
        kept = self._kept_idle(demand_id)
        return () if kept is None else kept[0]

    def idle_offer(self, demand_id: str) -> OfferKey | None:
        """The offer ``(provider, template_id)`` of every one of ``demand_id``'s available hosts' machines, if they
        share one (``None``: they do not, or it has none); kept with :meth:`idle_entries`."""
        kept = self._kept_idle(demand_id)
        return None if kept is None else kept[1]

    def _kept_idle(self, demand_id: str) -> tuple[list[IdleEntry], OfferKey | None] | None:
        kept = self._idle.get(demand_id)
        if kept is None:
            group = self._available.get(demand_id)
            if not group:
                return None
            offers = {(machine.provider, machine.template_id) for _, machine in group.values()}
            kept = self._idle[demand_id] = (_idle_entries(group), offers.pop() if len(offers) == 1 else None)
        return kept

    def reprobed_busy(self) -> list[tuple[str, Placed]]:
        """Busy hosts of active machines whose report came from a re-probe (``HostState.probed_at``)."""
        return list(self._reprobed_busy.items())

    # --- kept in step by the owning view ---------------------------------------------------------------------------

    def machine_added(self, machine: MachineRecord) -> None:
        """``machine`` became ``active_refs[machine.instance_ref]``."""
        self._age(machine)
        host = self._hosts.get(machine.instance_ref)
        if host is None:
            self._unjoin(machine)
        else:
            self._place(machine.instance_ref, host, machine)

    def machine_removed(self, machine: MachineRecord) -> None:
        """``machine`` is no longer ``active_refs[machine.instance_ref]`` (it left ACTIVE)."""
        self._join(machine)
        self._unplace(machine.instance_ref, machine)
        if self._aging is None:
            return
        if self._aging_unknown.pop(machine.instance_ref, None) is None and machine.launch_time > 0:
            self._aging_stale += 1

    # --- every active machine by launch time (planner.drain) -------------------------------------------------------

    def _aging_heap(self) -> list[MachineRecord]:
        """The launch-time heap, built from the active machines at its first use."""
        if self._aging is None:
            self._aging, self._aging_stale = [], 0
            for machine in self._active.values():
                self._age(machine)
        return self._aging

    def _age(self, machine: MachineRecord) -> None:
        if self._aging is None:
            return
        if machine.launch_time > 0:
            heapq.heappush(self._aging, machine)
        else:
            self._aging_unknown[machine.instance_ref] = machine

    def _aging_live(self, entry: MachineRecord) -> bool:
        return self._active.get(entry.instance_ref) is entry

    def active_launched_by(self, cutoff: float) -> list[MachineRecord]:
        """Active machines (joined or not) whose known launch time is at most ``cutoff``: pops the heap up to it
        and pushes the live entries back (O(k log n) for the k returned; the content never changes)."""
        heap = self._aging_heap()
        if self._aging_stale > len(heap) // 2 + 64:
            self._aging = heap = [m for m in self._active.values() if m.launch_time > 0]
            heapq.heapify(heap)
            self._aging_stale = 0
        found: dict[str, MachineRecord] = {}
        while heap and heap[0].launch_time <= cutoff:
            entry = heapq.heappop(heap)
            if self._aging_live(entry) and entry.instance_ref not in found:
                found[entry.instance_ref] = entry
            else:
                self._aging_stale -= 1
        for machine in found.values():
            heapq.heappush(heap, machine)
        return list(found.values())

    def active_unknown_launch(self) -> list[MachineRecord]:
        """Active machines whose launch time is unknown (counted from first seen: read every pass)."""
        self._aging_heap()
        return list(self._aging_unknown.values())

    def earliest_active_launch_after(self, cutoff: float) -> float | None:
        """The earliest known launch time after ``cutoff`` of an active machine (``None``: none)."""
        heap = self._aging_heap()
        found, dropped = _earliest_live_after(heap, cutoff, self._aging_live)
        self._aging_stale -= dropped
        return found

    def _unjoin(self, machine: MachineRecord) -> None:
        ref = machine.instance_ref
        if ref in self._unjoined:
            return
        self._unjoined[ref] = machine
        self._unjoined_by_op.setdefault(machine.op_id, {})[ref] = machine
        if machine.launch_time > 0:
            heapq.heappush(self._deadlines, machine)
        else:  # unknown (or not a number): never ordered, read every pass
            self._unknown_launch[ref] = machine

    def _join(self, machine: MachineRecord) -> None:
        """``machine`` has a host now, or left ACTIVE: no longer not-joined (its heap entry goes stale)."""
        ref = machine.instance_ref
        gone = self._unjoined.pop(ref, None)
        if gone is None:
            return
        by_op = self._unjoined_by_op[gone.op_id]
        del by_op[ref]
        if not by_op:
            del self._unjoined_by_op[gone.op_id]
        if self._unknown_launch.pop(ref, None) is None:
            self._stale += 1

    def _place(self, ref: str, host: HostState, machine: MachineRecord) -> None:
        if _available(host):
            self._reprobed_busy.pop(ref, None)
            self._available.setdefault(machine.demand_id, {})[ref] = (host, machine)
            self._idle.pop(machine.demand_id, None)
            self._unjudged[ref] = (host, machine)
        else:
            self._unplace(ref, machine)
            if host.status is HostStatus.BUSY and host.probed_at > 0 and host.capabilities:
                self._reprobed_busy[ref] = (host, machine)

    def _unplace(self, ref: str, machine: MachineRecord) -> None:
        self._reprobed_busy.pop(ref, None)
        if self._unjudged.pop(ref, None) is not None:
            self._unjudged_holes += 1
        by_ref = self._available.get(machine.demand_id)
        if by_ref is not None and by_ref.pop(ref, None) is not None:
            self._idle.pop(machine.demand_id, None)
            if not by_ref:
                del self._available[machine.demand_id]  # no empty groups: a pass iterates the groups it needs


def join_index(active_refs: Mapping[str, MachineRecord], hosts: Mapping[str, HostState]) -> JoinIndex | HostTable:
    """The :class:`JoinIndex` of ``hosts`` against ``active_refs``: the kept one when ``hosts`` is the table bound
    to them, else built now (a C-level set difference and one loop over hosts that skips busy ones at once).

    Built, a host is matched to its machine by ``host.instance_ref`` and a machine counts as joined when its ref is
    a key of ``hosts`` (for the usual mapping, keyed by instance_ref, the two agree).
    """
    if isinstance(hosts, HostTable):
        kept = hosts.indexes(active_refs)
        if kept is not None:
            return kept
    unjoined = {ref: active_refs[ref] for ref in active_refs.keys() - hosts.keys()}
    available: dict[str, dict[str, Placed]] = {}
    reprobed: dict[str, Placed] = {}
    busy, lost = HostStatus.BUSY, HostStatus.LOST
    for host in hosts.values():
        if host.status is lost:
            continue
        if host.status is busy:
            if host.probed_at > 0 and host.capabilities and host.instance_ref in active_refs:
                reprobed[host.instance_ref] = (host, active_refs[host.instance_ref])
            continue
        machine = active_refs.get(host.instance_ref)
        if machine is not None:
            available.setdefault(machine.demand_id, {})[host.instance_ref] = (host, machine)
    return JoinIndex(unjoined, available, reprobed)


def _earliest_live_after(
    heap: list[MachineRecord], cutoff: float, live: Callable[[MachineRecord], bool]
) -> tuple[float | None, int]:
    """The earliest launch time after ``cutoff`` among the heap's live entries (``live(entry)``), and how many dead
    entries were dropped on the way. The live entries up to ``cutoff`` are popped and pushed back (O(k log n) for
    the k of them); the heap's content is otherwise unchanged."""
    held: list[MachineRecord] = []
    found: float | None = None
    dropped = 0
    while heap:
        entry = heap[0]
        if not live(entry):
            heapq.heappop(heap)
            dropped += 1
        elif entry.launch_time <= cutoff:
            held.append(heapq.heappop(heap))
        else:
            found = entry.launch_time
            break
    for entry in held:
        heapq.heappush(heap, entry)
    return found, dropped
