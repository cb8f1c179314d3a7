"""The reconcile loop's reclaim poll: every ``reclaim_interval`` seconds, ask each leased provider which of its live
machines it takes back (``getReturnRequests``, e.g. spot interruptions) and fold them into the planner state as
``Reclaimed``, which drains and returns them. A plugin whose features say ``reclaimsByTags`` is asked by the
cluster's tag in one call; any other is named every live machine, 2,000 a call.

A failed poll is logged and tried again at the next interval; ``throttled`` also backs the provider off like any
other call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

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
from provisionerd.provider.contract import cluster_filter
from provisionerd.provider.paging import RECLAIM_CHUNK
from provisionerd.provider.values import MachineRef, Reclaim
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

        A plugin whose features say ``reclaims_by_tags`` is asked once, by the cluster's tag, naming no machine
        (``_ask_by_tags``): at rest the poll costs one small call whatever the fleet. Any other (or one whose
        ``describeProvider`` cannot be read now) is named every live machine of the view (``_ask``)."""
        features = await self._executor.features.read(provider)
        if features is not None and features.reclaims_by_tags:
            ids = await self._ask_by_tags(provider, view)
        else:
            records = await self._live(provider, view)
            if not records:
                return
            # The chunks' refs and documents are acyclic and freed by their counts; paused, the collector does not
            # walk them again and again as they pile up (~40% of a 100k-machine poll's CPU in one process).
            with collector_paused(len(records) >= OFF_LOOP_AT):
                ids = await self._ask(provider, records)
        if ids:
            self._events.emit("reclaimed", provider=provider, machines=sorted(ids))
            self._apply(Reclaimed(provider, tuple(sorted(ids)), self._wall()))

    @staticmethod
    async def _live(provider: str, view: ControllerView) -> list[MachineRecord]:
        """``provider``'s live machines in ``view``, picked out ``SCAN_SLICE`` at a time (a copy of its machines
        taken at once, read with a checkpoint before each slice): one pass over 100,000 records held the loop
        30-50 ms."""
        everyone = list(view.facts.machines.values())
        records: list[MachineRecord] = []
        for start in range(0, len(everyone), SCAN_SLICE):
            await trio.lowlevel.checkpoint()
            records += [m for m in everyone[start : start + SCAN_SLICE] if m.provider == provider and m.state.live]
        return records

    async def _ask(self, provider: str, records: list[MachineRecord]) -> set[str]:
        """The ids of ``records`` the provider takes back, named ``RECLAIM_CHUNK`` at a time, one call each (the
        client pages each answer), with a checkpoint between chunks: at 100k machines neither a line nor a stretch
        of the loop grows with the fleet. None when a call fails (the whole poll is made again at the next
        interval)."""
        ids: set[str] = set()
        for start in range(0, len(records), RECLAIM_CHUNK):
            await trio.lowlevel.checkpoint()
            chunk = records[start : start + RECLAIM_CHUNK]
            answer = await self._call(provider, [MachineRef(m.machine_id, m.hostname) for m in chunk])
            if answer is None:
                return set()
            if answer:  # the usual answer is empty: nothing to map back onto the chunk
                ids |= _known(answer, chunk)
        return ids

    async def _ask_by_tags(self, provider: str, view: ControllerView) -> set[str]:
        """The ids of ``provider``'s live machines in ``view`` that the provider takes back, asked by the cluster's
        tag alone (the plugin answers for every machine carrying it). What it names that the view does not hold as
        this provider's live machine is not ours to drain, as in ``_ask``: another provider's, one already
        returned, or one the daemon never made."""
        answer = await self._call(provider, (), tags=cluster_filter(self._executor.settings.cluster))
        if not answer:
            return set()
        machines = view.facts.machines
        named = [m for r in answer if (m := machines.get(r.machine_id)) is not None]
        if any(not r.machine_id for r in answer):  # an answer by name only (an LSF-style plugin): read the view
            named = await self._live(provider, view)
        return _known(answer, [m for m in named if m.provider == provider and m.state.live])

    async def _call(
        self, provider: str, machines: Sequence[MachineRef], *, tags: Mapping[str, str] | None = None
    ) -> tuple[Reclaim, ...] | None:
        """One ``getReturnRequests``; ``None`` when it failed (logged; ``throttled`` backs the provider off)."""
        try:
            return await self._executor.client(provider).get_return_requests(machines, tags=tags)
        except ProviderError as exc:
            if isinstance(exc, errors.Throttled):
                self._apply(Throttled(provider, self._wall()))
            log.info("getReturnRequests for %s failed: %s", provider, exc)
            return None


def _known(answer: Sequence[Reclaim], records: Sequence[MachineRecord]) -> set[str]:
    """The ids of ``records`` that ``answer`` names: by id, or by name when the answer gives no id. An id not among
    ``records`` is not taken by its name either."""
    names = {m.hostname: m.machine_id for m in records if m.hostname}
    known = {m.machine_id for m in records}
    ids: set[str] = set()
    for reclaim in answer:
        machine_id = reclaim.machine_id or names.get(reclaim.name, "")
        if machine_id in known:
            ids.add(machine_id)
    return ids
