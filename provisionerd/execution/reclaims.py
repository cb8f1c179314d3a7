"""The reconcile loop's reclaim poll: every ``reclaim_interval`` seconds, ask each leased provider which of its live
machines it takes back (``getReturnRequests``, e.g. spot interruptions) and fold them into the planner state as
``Reclaimed``, which drains and returns them.

A failed poll is logged and tried again at the next interval; ``throttled`` also backs the provider off like any
other call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from provisionerd.controller.session_settings import LinkState
from provisionerd.controller.view import ControllerView
from provisionerd.domain import errors
from provisionerd.domain.errors import ProviderError
from provisionerd.execution.executor import Executor
from provisionerd.execution.loop_inputs import ViewSource
from provisionerd.execution.orphan_offload import OFF_LOOP_AT, collector_paused
from provisionerd.planner.capacity import Throttled
from provisionerd.planner.fact_view import MachineRecord
from provisionerd.planner.state import Observation, Reclaimed
from provisionerd.provider.paging import RECLAIM_CHUNK
from provisionerd.provider.values import MachineRef
from provisionerd.telemetry.events import EventLog

log = logging.getLogger(__name__)

#: Records of the view read in one step of the loop when the poll picks out a provider's live machines.
SCAN_SLICE = 10_000


class ReclaimPoll:
    """``leased`` lists the providers the loop may act for now; ``apply`` folds an observation into the planner
    state and wakes the loop; ``wall`` is the planner's clock."""

    def __init__(
        self,
        session: ViewSource,
        executor: Executor,
        events: EventLog,
        interval: float,
        *,
        leased: Callable[[], list[str]],
        apply: Callable[[Observation], None],
        wall: Callable[[], float],
    ) -> None:
        self._session = session
        self._executor = executor
        self._events = events
        self._interval = interval
        self._leased = leased
        self._apply = apply
        self._wall = wall

    async def run(self) -> None:
        while True:
            await trio.sleep(self._interval)
            view = self._session.view
            if view is None or self._session.state is not LinkState.UP:
                continue
            for provider in self._leased():
                await self.poll(provider, view)

    async def poll(self, provider: str, view: ControllerView) -> None:
        """Ask ``provider`` which of its live machines it takes back; fold them as ``Reclaimed``.

        The live machines are named ``RECLAIM_CHUNK`` at a time, one call each (the client pages each answer),
        with a checkpoint between chunks: at 100k machines neither a line nor a stretch of the loop grows with
        the fleet. They are picked out of the view ``SCAN_SLICE`` at a time too (a copy of its machines taken at
        once, read with a checkpoint before each slice): one pass over 100,000 records held the loop 30-50 ms."""
        everyone = list(view.facts.machines.values())
        records: list[MachineRecord] = []
        for start in range(0, len(everyone), SCAN_SLICE):
            await trio.lowlevel.checkpoint()
            records += [m for m in everyone[start : start + SCAN_SLICE] if m.provider == provider and m.state.live]
        del everyone
        if not records:
            return
        # The chunks' refs and documents are acyclic and freed by their counts; paused, the collector does not walk
        # them again and again as they pile up (~40% of a 100k-machine poll's CPU in one process, measured).
        with collector_paused(len(records) >= OFF_LOOP_AT):
            ids = await self._ask(provider, records)
        if ids:
            self._events.emit("reclaimed", provider=provider, machines=sorted(ids))
            self._apply(Reclaimed(provider, tuple(sorted(ids)), self._wall()))

    async def _ask(self, provider: str, records: list[MachineRecord]) -> set[str]:
        """The ids of ``records`` the provider takes back, asked chunk by chunk; none when a call fails (the whole
        poll is made again at the next interval)."""
        client = self._executor.client(provider)
        ids: set[str] = set()
        for start in range(0, len(records), RECLAIM_CHUNK):
            await trio.lowlevel.checkpoint()
            chunk = records[start : start + RECLAIM_CHUNK]
            try:
                answer = await client.get_return_requests([MachineRef(m.machine_id, m.hostname) for m in chunk])
            except ProviderError as exc:
                if isinstance(exc, errors.Throttled):
                    self._apply(Throttled(provider, self._wall()))
                log.info("getReturnRequests for %s failed: %s", provider, exc)
                return set()
            if not answer:
                continue  # the usual answer: nothing to map back onto the chunk
            names = {m.hostname: m.machine_id for m in chunk if m.hostname}
            known = {m.machine_id for m in chunk}
            for reclaim in answer:
                machine_id = reclaim.machine_id or names.get(reclaim.name, "")
                if machine_id in known:
                    ids.add(machine_id)
        return ids
