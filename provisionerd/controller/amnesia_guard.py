"""The daemon's side of DESIGN invariant 9: a controller that forgot what it acknowledged gets no mutation until an
admin decides.

``AmnesiaGuard`` holds the ``ControllerMemory`` (loaded from its ``MemoryStore`` at start, saved as it grows) and
applies the pure rules of ``controller.amnesia`` where the evidence arrives:

- the session calls ``check_join`` with every accepted ``JoinReply`` (incarnation, last index) before it serves
  the link, and ``note_acknowledged`` with every fact index the controller acknowledged or resynced;
- each lease keeper (its ``judge``) calls ``check_grant`` before it holds a new grant, and ``note_granted`` once it
  does.

A finding **halts** the daemon: it is logged at ERROR, emitted as a ``controller_amnesia`` event, counted
(``alarms``) and shown by ``status()``. The guard calls no one: those that must stop wait for it
(``wait_halted``): every lease keeper lapses at once (and no lease is valid while ``halted``), and the session
breaks its link and stays away until the halt ends. While halted, ``halted`` names
the reason: the mutation gate refuses with ``MutationsHalted`` before any provider call, nothing is returned,
nothing is cleaned up as an orphan (no lease, no view), and the memory is not updated by anything the forgetful
controller says. Only ``accept_reset`` (the admin's ``provisionerd controller accept-reset``) ends the halt: it
remembers the controller as it is now and the session joins again.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from provisionerd.controller import amnesia
from provisionerd.controller.amnesia import Amnesia, ControllerMemory
from provisionerd.controller.memory_file import MemoryStore
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.events import EventLog

log = logging.getLogger(__name__)


class AmnesiaGuard:
    def __init__(self, store: MemoryStore, events: EventLog) -> None:
        """Loads the memory now: raises ``StateFileDamaged`` for a state file that cannot be trusted."""
        self._store = store
        self._events = events
        self.memory: ControllerMemory = store.load()
        self.finding: Amnesia | None = None
        self.alarms = 0
        self.save_failures = 0
        self._cleared = trio.Event()
        self._halted = trio.Event()

    @property
    def halted(self) -> str | None:
        """Why every mutation is stopped, or ``None`` when they may run."""
        return None if self.finding is None else f"controller amnesia: {self.finding.detail}"

    async def wait_halted(self) -> None:
        """Return once a halt is in force (at once when one is)."""
        while self.finding is None:
            await self._halted.wait()

    async def wait_cleared(self) -> None:
        """Return once no halt is in force (at once when none is)."""
        while self.finding is not None:
            await self._cleared.wait()

    # --- evidence -----------------------------------------------------------------------------------------------

    def check_join(self, incarnation: str, last_index: int) -> Amnesia | None:
        """Judge an accepted join; a finding halts the daemon (and is returned). While halted, the current finding
        is returned whatever the join says: only an admin ends a halt."""
        if self.finding is not None:
            return self.finding
        finding = amnesia.judge_join(self.memory, incarnation, last_index)
        if finding is not None:
            self._halt(finding)
            return finding
        self._remember(amnesia.joined(self.memory, incarnation))
        return None

    def check_grant(self, provider: str, epoch: Epoch, held_this_start: Epoch | None) -> Amnesia | None:
        """Judge a new lease grant before it is held; a finding halts the daemon (and is returned)."""
        if self.finding is not None:
            return self.finding
        finding = amnesia.judge_grant(self.memory, provider, epoch, held_this_start)
        if finding is not None:
            self._halt(finding)
        return finding

    def note_granted(self, provider: str, epoch: Epoch) -> None:
        if self.finding is None:
            self._remember(amnesia.granted(self.memory, provider, epoch))

    def note_acknowledged(self, index: int) -> None:
        if self.finding is None:
            self._remember(amnesia.acknowledged(self.memory, index))

    # --- the admin's decision -----------------------------------------------------------------------------------

    def accept_reset(self, by: str) -> dict[str, Any]:
        """Remember the controller as it is now and let mutations resume. The reply document for the admin."""
        finding = self.finding
        if finding is None:
            return {"ok": False, "error": "no controller amnesia to accept: mutations are not halted"}
        before = self.memory
        self._remember(amnesia.accept_reset(finding), force=True)
        self.finding = None
        self._cleared.set()
        self._cleared = trio.Event()
        self._halted = trio.Event()
        log.warning(
            "controller reset accepted by %s: incarnation %r (was %r), last index %s (was %s); mutations resume",
            by,
            finding.incarnation,
            before.incarnation,
            finding.last_index,
            before.last_index,
        )
        self._events.emit(
            "controller_reset_accepted",
            by=by,
            reason=finding.reason,
            incarnation=finding.incarnation,
            previous_incarnation=before.incarnation,
            last_index=finding.last_index,
            previous_last_index=before.last_index,
        )
        return {"ok": True, "accepted": self._describe(finding), "memory": self._memory_doc()}

    def status(self) -> dict[str, Any]:
        return {
            "halted": self.finding is not None,
            "finding": None if self.finding is None else self._describe(self.finding),
            "alarms": self.alarms,
            "memory": self._memory_doc(),
            "state_file": self._store.where,
            "save_failures": self.save_failures,
        }

    # --- inside ---------------------------------------------------------------------------------------------------

    def _halt(self, finding: Amnesia) -> None:
        self.finding = finding
        self.alarms += 1
        log.error(
            "CONTROLLER AMNESIA (%s): %s. Every mutation is stopped and every machine kept until an admin runs"
            " 'provisionerd controller accept-reset'",
            finding.reason,
            finding.detail,
        )
        self._events.emit("controller_amnesia", **self._describe(finding), remembered=self._memory_doc())
        self._halted.set()

    def _remember(self, memory: ControllerMemory, *, force: bool = False) -> None:
        if memory == self.memory and not force:
            return
        self.memory = memory
        try:
            self._store.save(memory)
        except OSError as exc:  # the memory still holds in this process; the next change tries again
            self.save_failures += 1
            log.error("cannot save the controller state file %s: %s", self._store.where, exc)

    @staticmethod
    def _describe(finding: Amnesia) -> dict[str, Any]:
        return {
            "reason": finding.reason,
            "detail": finding.detail,
            "incarnation": finding.incarnation,
            "last_index": finding.last_index,
            "provider": finding.provider or None,
            "epoch": None if finding.epoch is None else str(finding.epoch),
        }

    def _memory_doc(self) -> dict[str, Any]:
        m = self.memory
        return {
            "incarnation": m.incarnation,
            "last_index": m.last_index,
            "epochs": {p: str(e) for p, e in m.epochs.items()},
        }
