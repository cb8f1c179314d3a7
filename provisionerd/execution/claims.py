"""Busy claims: never two actions on one op_id or one machine at once.

The executor owns one ``BusyClaims``; every flow it runs holds a claim on its op_id (and, for a return, its
machines) for as long as it runs, and a call that finds them claimed is dropped at once (``code="busy"``), never
queued. The reconcile loop claims through the executor too, when it plans an action (``Executor.claim``): the task
that runs it may start after the next cycle has planned, and that cycle must not plan a second action on the same
op or machines. That one ``Claim`` is held until the action's call ends: the executor is handed it and does not
claim again (issue 31 item 1: the op had been claimed, released and claimed again on its way).
"""

from __future__ import annotations

from collections.abc import Collection, Set

import attrs


@attrs.frozen
class Claim:
    """One held claim: an op_id and the machines it works on. Released by its owner, once."""

    op_id: str
    machines: tuple[str, ...] = ()


@attrs.define(eq=False)
class BusyClaims:
    _ops: set[str] = attrs.field(factory=set)
    _machines: set[str] = attrs.field(factory=set)

    def try_claim(self, op_id: str, machine_ids: Collection[str] = ()) -> bool:
        """Claim ``op_id`` and ``machine_ids`` if none of them is claimed; whether it did (all or nothing)."""
        if op_id in self._ops or not self._machines.isdisjoint(machine_ids):
            return False
        self._ops.add(op_id)
        self._machines.update(machine_ids)
        return True

    def claim(self, op_id: str, machine_ids: Collection[str] = ()) -> Claim | None:
        """``try_claim`` as a value its holder hands on and releases (``release_claim``); ``None``: busy."""
        return Claim(op_id, tuple(machine_ids)) if self.try_claim(op_id, machine_ids) else None

    def release_claim(self, claim: Claim) -> None:
        self.release(claim.op_id, claim.machines)

    def release(self, op_id: str, machine_ids: Collection[str] = ()) -> None:
        """Give back a claim (releasing what is not claimed is harmless)."""
        self._ops.discard(op_id)
        self._machines.difference_update(machine_ids)

    def is_busy(self, op_id: str) -> bool:
        return op_id in self._ops

    @property
    def ops(self) -> Set[str]:
        """The op_ids claimed now (a read-only copy)."""
        return frozenset(self._ops)

    @property
    def machines(self) -> Set[str]:
        """The machine ids claimed now (a read-only copy)."""
        return frozenset(self._machines)
