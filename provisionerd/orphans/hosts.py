"""Host states indexed for the orphan classifier's two kinds of match.

Pure. A machine matches a host *by identity* (the instance ref its bootstrap carried, or its machine id) or, for
a machine we have no fact for, also *by hostname or address*. Identity matches are what the controller recorded
when the worker joined with its token; name and address matches are the weaker evidence used for adoption, so
they only count against live hosts that no other tracked machine claims.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from provisionerd.domain.model import HostState, HostStatus, ProviderMachine
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
        self._by_ref: dict[str, _Entry] = {}
        self._by_id: dict[str, _Entry] = {}
        self._by_name: dict[str, _Entry] = {}
        self._by_address: dict[str, _Entry] = {}
        for host in hosts:
            if host.provider != provider:
                continue
            _add(self._by_ref, host.instance_ref, host)
            _add(self._by_id, host.machine_id, host)
            _add(self._by_name, host.hostname, host)
            _add(self._by_address, host.address, host)
        live = view.live_machines(provider) if live is None else live
        self._fact_ids = {m.machine_id for m in live}
        self._fact_refs = {m.instance_ref: m.machine_id for m in live if m.instance_ref}

    @staticmethod
    def _lookup(index: dict[str, _Entry], value: str) -> list[HostState]:
        entry = index.get(value) if value else None
        if entry is None:
            return []
        return entry if isinstance(entry, list) else [entry]

    def joined(self, machine_id: str, instance_ref: str) -> bool:
        """Whether any host state (live or lost) is this machine by identity: it joined at some point."""
        return bool(instance_ref and instance_ref in self._by_ref) or bool(machine_id and machine_id in self._by_id)

    def strong(self, machine_id: str, instance_ref: str) -> list[HostState]:
        """Hosts that are this machine by identity (instance ref from its bootstrap, or machine id)."""
        return _unique(self._lookup(self._by_ref, instance_ref) + self._lookup(self._by_id, machine_id))

    def live_matches(self, machine: ProviderMachine, instance_ref: str) -> list[HostState]:
        """Live hosts matching a fact-less machine by identity, hostname or address, minus hosts that belong to
        another machine we track (an address reused by a new machine must not adopt it onto a busy host)."""
        candidates = (
            self.strong(machine.machine_id, instance_ref)
            + self._lookup(self._by_name, machine.name)
            + self._lookup(self._by_address, machine.address)
        )
        return [
            host
            for host in _unique(candidates)
            if host.status is not HostStatus.LOST and not self._claimed_elsewhere(host, machine.machine_id)
        ]

    def _claimed_elsewhere(self, host: HostState, machine_id: str) -> bool:
        if host.machine_id and host.machine_id != machine_id and host.machine_id in self._fact_ids:
            return True
        owner = self._fact_refs.get(host.instance_ref) if host.instance_ref else None
        return owner is not None and owner != machine_id


_Entry = HostState | list[HostState]


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
