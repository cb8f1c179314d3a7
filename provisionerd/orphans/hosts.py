"""Host states indexed for the orphan classifier's two kinds of match.

Pure. A machine matches a host *by identity* (the instance ref its bootstrap carried, or its machine id) or, for
a machine we have no fact for, also *by hostname or address*. Identity matches are what the controller recorded
when the worker joined with its token; name and address matches are the weaker evidence used for adoption, so
they only count against live hosts that no other tracked machine claims.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

import attrs

from provisionerd.domain.model import HostState, HostStatus, ListedMachine
from provisionerd.planner.fact_view import FactView, MachineRecord


def host_evidence(host: HostState) -> dict[str, Any]:
    """A host as a finding's evidence shows it (no token or hash: a host state carries none)."""
    return {
        "hostname": host.hostname,
        "address": host.address,
        "instance_ref": host.instance_ref,
        "machine_id": host.machine_id,
        "status": host.status.value,
    }


class HostIndex:
    """The provider's host states, indexed by each key a match can use (one pass is O(machines + hosts))."""

    def __init__(
        self, hosts: Iterable[HostState], provider: str, view: FactView, live: list[MachineRecord] | None = None
    ) -> None:
        """``live``: ``view.live_machines(provider)``, when the caller has it already (one list of 100k per pass)."""
        # value -> host, or a list of hosts when several share it: no container per host, which on 100k hosts
        # is the difference between milliseconds and seconds of garbage-collector work.
        self._hosts = [host for host in hosts if host.provider == provider]
        self._by_ref = _index(self._hosts, attrgetter("instance_ref"))
        self._by_id = _index(self._hosts, attrgetter("machine_id"))
        # Read only for a machine without a fact (``live_matches``): built at its first use, never in the usual
        # pass, where every listed machine has its fact (at 100k hosts they were ~40% of a pass's classifying).
        self._view, self._provider, self._live = view, provider, live
        self._weak: _Weak | None = None

    def _weak_keys(self) -> _Weak:
        if self._weak is None:
            live = self._view.live_machines(self._provider) if self._live is None else self._live
            self._weak = _Weak(
                _index(self._hosts, attrgetter("hostname")),
                _index(self._hosts, attrgetter("address")),
                {m.machine_id for m in live},
                {m.instance_ref: m.machine_id for m in live if m.instance_ref},
            )
            self._live = None  # not held past its use
        return self._weak

    @staticmethod
    def _lookup(index: dict[str, _Entry], value: str) -> list[HostState]:
        entry = index.get(value) if value else None
        if entry is None:
            return []
        return entry if isinstance(entry, list) else [entry]

    def joined(self, machine_id: str, instance_ref: str) -> bool:
        """Whether any host state (live or lost) is this machine by identity: it joined at some point."""
        return instance_ref in self._by_ref or machine_id in self._by_id  # "" is never a key (``_index``)

    def strong(self, machine_id: str, instance_ref: str) -> list[HostState]:
        """Hosts that are this machine by identity (instance ref from its bootstrap, or machine id)."""
        return _unique(self._lookup(self._by_ref, instance_ref) + self._lookup(self._by_id, machine_id))

    def live_matches(self, machine: ListedMachine, instance_ref: str) -> list[HostState]:
        """Live hosts matching a fact-less machine by identity, hostname or address, minus hosts that belong to
        another machine we track (an address reused by a new machine must not adopt it onto a busy host)."""
        weak = self._weak_keys()
        candidates = (
            self.strong(machine.machine_id, instance_ref)
            + self._lookup(weak.by_name, machine.name)
            + self._lookup(weak.by_address, machine.address)
        )
        return [
            host
            for host in _unique(candidates)
            if host.status is not HostStatus.LOST and not self._claimed_elsewhere(host, machine.machine_id)
        ]

    def _claimed_elsewhere(self, host: HostState, machine_id: str) -> bool:
        weak = self._weak_keys()
        if host.machine_id and host.machine_id != machine_id and host.machine_id in weak.fact_ids:
            return True
        owner = weak.fact_refs.get(host.instance_ref) if host.instance_ref else None
        return owner is not None and owner != machine_id


_Entry = HostState | list[HostState]


@attrs.frozen
class _Weak:
    """The keys only a fact-less machine's match reads: hosts by hostname and address, and the live facts' claims
    (their machine ids, and instance ref -> machine id)."""

    by_name: dict[str, _Entry]
    by_address: dict[str, _Entry]
    fact_ids: set[str]
    fact_refs: dict[str, str]


def _index(hosts: list[HostState], key: Callable[[HostState], str]) -> dict[str, _Entry]:
    """``hosts`` by ``key`` (``_add``'s index, without the empty key). The usual fleet has one host per value: one
    dict comprehension builds that (~25x faster than adding host by host); any repeated or empty value makes the
    comprehension's dict shorter than the list, and the index is then built host by host."""
    index: dict[str, _Entry] = {key(host): host for host in hosts}
    if len(index) == len(hosts) and "" not in index:
        return index
    index = {}
    for host in hosts:
        _add(index, key(host), host)
    return index


def _add(index: dict[str, _Entry], value: str, host: HostState) -> None:
    if not value:
        return
    entry = index.get(value)
    if entry is None:
        index[value] = host
    elif isinstance(entry, list):
        entry.append(host)
    else:
        index[value] = [entry, host]


def _unique(hosts: list[HostState]) -> list[HostState]:
    """Distinct hosts (two host states with the same identity are one host), in a stable order."""
    found = {(h.instance_ref, h.machine_id, h.hostname, h.address): h for h in hosts}
    return [found[key] for key in sorted(found)]
