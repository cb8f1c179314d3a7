"""What the executor's flows are given (``FlowDeps``) and the steps they share (``Steps``): emit an action event,
turn a failure into planner observations, list an op by its tag, poll a request to its end, commit the instance
facts of what a request made, and settle a refused request.

Every flow (``RequestFlow``, ``ReturnFlow``, ``UnknownOutcomeFlow``, ``LegacyRequestFlow``) receives the same
``FlowDeps`` and ``Steps`` in its constructor; none reaches into another's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.domain.errors import (
    ControllerRejected,
    ControllerStorageFailure,
    LeaseError,
    MutationsHalted,
    ProviderError,
    ProviderProtocolViolation,
    ProviderUnsupported,
)
from provisionerd.domain.model import NO_EPOCH, InstanceFact, ProviderMachine, RequestFailed, RequestIntent
from provisionerd.domain.tokens import IssuedToken
from provisionerd.execution.call_rules import assign_refs
from provisionerd.execution.facts import LeasedFacts
from provisionerd.execution.gate import LEASE_LOST_REASONS, MutationGate
from provisionerd.execution.observations import gate_refusal_observation, provider_error_observation, refusal_code
from provisionerd.execution.op_book import OpRecord, Stage
from provisionerd.execution.values import GATE_ERRORS, ExecutorSettings, RequestOutcome
from provisionerd.planner.capacity import ProviderUnhealthy
from provisionerd.planner.state import ActionDropped
from provisionerd.provider.client import ProviderClient
from provisionerd.provider.contract import op_filter
from provisionerd.provider.values import (
    MachineRequest,
    OwnerTags,
    RequestAccepted,
    RequestStatus,
    foreign_request,
    status_for,
)
from provisionerd.telemetry.events import EventLog

log = logging.getLogger(__name__)

#: How long the instance facts of machines already made are retried while the controller answers
#: ``storage_failure`` (its disk is full), with a back-off doubling from 1 s to ``STORAGE_RETRY_MAX``: the machines
#: exist, and once the disk is freed their facts go in at once instead of waiting for the recovery pass.
STORAGE_RETRY_FOR = 60.0
#: A provider whose calls are answered with a requestId it then does not know this many times in a row is unhealthy.
FOREIGN_UNHEALTHY_AFTER = 2
STORAGE_RETRY_MAX = 4.0


@attrs.frozen
class FlowDeps:
    """The executor's dependencies, as every flow receives them.

    ``clients``: the provider client of each provider served. ``gate``: every mutation passes it. ``facts``: the
    fact view and the commits of non-mutating facts. ``wall``: the wall clock of planner observations (the
    planner's ``now``); everything a flow waits for runs on trio's clock."""

    settings: ExecutorSettings
    clients: Mapping[str, ProviderClient]
    gate: MutationGate
    facts: LeasedFacts
    events: EventLog
    wall: Callable[[], float]


class Steps:
    def __init__(self, deps: FlowDeps) -> None:
        self._deps = deps
        #: provider -> calls in a row (creates and returns alike) whose requestId the plugin then did not know.
        self._foreign_in_a_row: dict[str, int] = {}

    def foreign_id(self, run: OpRecord, provider: str, op_id: str, violation: ProviderProtocolViolation) -> str:
        """The plugin does not know the requestId its own call answered (issue 31, finding 3): a protocol
        violation, logged; the ``FOREIGN_UNHEALTHY_AFTER``-th in a row makes the provider unhealthy
        (``protocol_violation``), its reason naming the id it got and the one it expected. The detail."""
        in_a_row = self._foreign_in_a_row[provider] = self._foreign_in_a_row.get(provider, 0) + 1
        detail = f"op {op_id}: {violation.detail}"[:500]
        log.warning("provider %s: protocol violation (%d in a row): %s", provider, in_a_row, detail)
        if in_a_row >= FOREIGN_UNHEALTHY_AFTER:
            run.add(ProviderUnhealthy(provider, "protocol_violation", self._deps.wall(), detail))
        return detail

    def id_known(self, provider: str) -> None:
        """The plugin knew the requestId it answered: its violations are no longer in a row."""
        self._foreign_in_a_row.pop(provider, None)

    def emit(self, phase: str, kind: str, op_id: str, provider: str, **fields: Any) -> None:
        """An ``action`` event (``called``, ``recovery``, ``result`` ...). Never give it a join token."""
        self._deps.events.emit("action", phase=phase, kind=kind, op_id=op_id, provider=provider, **fields)

    def observe_error(self, run: OpRecord, provider: str, template_id: str, exc: ProviderError) -> None:
        """Add what ``exc`` means for the planner to ``run`` (``observations.provider_error_observation``). An
        unhealthy provider is raised as an event where the observation is folded (the reconcile loop)."""
        obs = provider_error_observation(provider, template_id, exc, self._deps.wall())
        if obs is not None:
            run.add(obs)

    def gate_refused(self, run: OpRecord, provider: str, exc: Exception) -> None:
        """Tell the planner the controller would not take an intent now, so it backs off before planning the
        same work again (``provisionerd.planner.state.IntentRefused``)."""
        obs = gate_refusal_observation(provider, exc, self._deps.wall())
        if obs is not None:
            run.add(obs)

    def request_dropped(self, run: OpRecord, provider: str, op_id: str, exc: Exception) -> None:
        """The gate refused a request's intent (``exc``), so no provider call was made: the planner forgets the
        request (``ActionDropped``) and backs off (``gate_refused``). The one place that decides whether the
        request leaves the step window: it does when the controller answered that it took no intent (any
        ``ControllerRejected``: ``storage_failure``, ``no_quorum``, ``stale_epoch``...); a broken link (the intent
        may be in the log) or a lease that lapsed around the ack keeps it counted."""
        run.add(ActionDropped(op_id, unacknowledged=isinstance(exc, ControllerRejected), request=run.pending_request()))
        self.gate_refused(run, provider, exc)

    async def gated_request(
        self, run: OpRecord, intent: RequestIntent, issued: Sequence[IssuedToken], **fields: Any
    ) -> tuple[RequestAccepted | None, ProviderError | None]:
        """One ``requestMachines`` through the gate, at the moment it starts: the intent committed (or
        acknowledged again) under the epoch held now, the owner tags carrying that epoch, the call. Its answer or
        its error (never both); a ``called`` event with ``fields`` (``retry``). Raises ``GATE_ERRORS`` when the gate
        refuses: then nothing was called. The first call and every same-op retry go through here. ``run`` moves
        through its stages: intent, calling, then unknown when the call's outcome is."""
        s, op_id, provider = self._deps.settings, intent.op_id, intent.provider
        run.enter(Stage.INTENT)
        async with self._deps.gate.mutation(provider, intent) as permit:
            run.enter(Stage.CALLING)
            request = MachineRequest.of(
                OwnerTags(s.cluster, provider, op_id, permit.epoch),
                intent.template_id,
                issued,
                s.controllers,
                s.limits_of(provider),
                intent.all_or_nothing,
            )
            self.emit(
                "called",
                "request",
                op_id,
                provider,
                template=intent.template_id,
                count=intent.count,
                epoch=permit.epoch,
                **fields,
            )
            try:
                return await self._deps.clients[provider].request_machines(request), None
            except ProviderError as exc:
                if exc.outcome_unknown:
                    run.enter(Stage.UNKNOWN)
                return None, exc

    async def list_op(
        self, provider: str, op_id: str, *, unlistable_as_empty: bool = False
    ) -> tuple[ProviderMachine, ...] | None:
        """The live machines tagged with ``op_id`` (``None`` when the listing failed). With ``unlistable_as_empty``
        (a legacy op whose outcome is unknown) a plugin's ``ProviderUnsupported`` is "nothing listable", not a
        failure: the legacy adapter says so of an op none of whose calls answered (what it made, if anything, is
        invisible and the orphan report names it), while a listing that failed (the plugin crashed) stays a failure."""
        try:
            rows = await self._deps.clients[provider].list_machines(
                op_filter(self._deps.settings.cluster, provider, op_id)
            )
        except ProviderUnsupported as exc:
            if unlistable_as_empty:
                return ()
            log.warning("listMachines for op %s failed: %s", op_id, exc)
            return None
        except ProviderError as exc:
            log.warning("listMachines for op %s failed: %s", op_id, exc)
            return None
        return tuple(row.machine() for row in rows)

    async def poll(
        self, run: OpRecord, provider: str, request_id: str, deadline: float, *, answered_by: str = ""
    ) -> RequestStatus | None:
        """Poll until the request is final or ``deadline`` (trio clock) passes; the last status seen. With
        ``answered_by`` (the call whose answer the plugin itself just gave the id: ``requestMachines``,
        ``requestReturnMachines``, ``stopMachines``) an answer showing that the plugin does not know the id raises
        ``ProviderProtocolViolation`` (``provider.values.foreign_request``); see ``foreign_id``."""
        s = self._deps.settings
        run.enter(Stage.POLLING)
        delay = s.poll_initial
        last: RequestStatus | None = None
        while True:
            wake = trio.current_time() + delay
            if wake > deadline:
                await trio.sleep_until(deadline)
                return last
            await trio.sleep_until(wake)
            try:
                statuses = await self._deps.clients[provider].get_request_status([request_id])
            except ProviderError as exc:
                self.observe_error(run, provider, "", exc)
                log.info("getRequestStatus %s failed: %s", request_id, exc)
            else:
                foreign = foreign_request(statuses, request_id, answered_by) if answered_by else None
                if foreign is not None:
                    raise ProviderProtocolViolation(provider, "getRequestStatus", foreign)
                status = status_for(statuses, request_id)
                if status is not None:
                    last = status
                    if status.final:
                        return status
            delay = min(s.poll_max, delay * s.poll_multiplier)

    async def commit_instances(
        self, intent: RequestIntent, machines: Sequence[ProviderMachine]
    ) -> tuple[str, ...] | None:
        """Commit an InstanceFact per machine of ``intent`` not in the facts yet; the machine ids committed
        (``None`` when a commit failed: the rest is left to recovery)."""
        known = self._deps.facts.view()
        hashes = dict(zip(intent.instance_refs, intent.token_hashes, strict=False))
        committed = []
        for machine, ref in assign_refs(machines, intent.instance_refs):
            if known is not None and machine.machine_id in known.machines:
                committed.append(machine.machine_id)
                continue
            fact = InstanceFact(
                intent.provider,
                NO_EPOCH,
                intent.op_id,
                ref,
                machine.machine_id,
                intent.template_id,
                hashes[ref],
                machine.name,
                machine.address,
                machine.launch_time,
                intent.price if machine.price is None else machine.price,  # the quote it really runs at, if said
                machine.instance_type,
            )
            if not await self._commit_made(fact):
                return None
            committed.append(machine.machine_id)
        return tuple(committed)

    async def _commit_made(self, fact: InstanceFact) -> bool:
        """Commit the fact of a machine that exists. Within ``STORAGE_RETRY_FOR``: a ``storage_failure`` is retried
        with back-off, and a refusal because the lease was lost (``no_lease`` / ``stale_epoch`` from the controller,
        which lapses the keeper, or no valid lease here) is committed again as soon as the lease is held again,
        stamped with its epoch, unless the view shows the machine by then. Any other failure (a lost link: the
        outcome is unknown; a halt) is logged and left to recovery. Whether it was committed."""
        give_up = trio.current_time() + STORAGE_RETRY_FOR
        delay = 1.0
        while True:
            try:
                await self._deps.facts.commit(fact)
                return True
            except ControllerStorageFailure as exc:
                if trio.current_time() + delay > give_up:
                    log.warning("could not commit %s for %s: %s (gave up)", type(fact).__name__, fact.op_id, exc)
                    return False
                await trio.sleep(delay)
                delay = min(STORAGE_RETRY_MAX, delay * 2)
            except GATE_ERRORS as exc:
                if not _lease_lost(exc):
                    log.warning("could not commit %s for %s: %s", type(fact).__name__, fact.op_id, exc)
                    return False
                with trio.move_on_at(give_up):
                    await self._deps.facts.wait_leased(fact.provider)
                if trio.current_time() >= give_up:
                    log.warning(
                        "could not commit %s for %s: %s (no lease again in time)", type(fact).__name__, fact.op_id, exc
                    )
                    return False
                view = self._deps.facts.view()
                if view is not None and fact.machine_id in view.machines:
                    return True  # committed meanwhile (its ack was the refusal's victim, or recovery's)

    async def refused(self, run: OpRecord, intent: RequestIntent, error: ProviderError) -> RequestOutcome:
        """A ``requestMachines`` refused with a known outcome (nothing was made): tell the planner what the code
        means, commit ``RequestFailed`` so it plans the work again, report ``rejected``."""
        code = refusal_code(error)
        self.observe_error(run, intent.provider, intent.template_id, error)
        await self._deps.facts.commit_quietly(RequestFailed(intent.provider, NO_EPOCH, intent.op_id, code))
        return RequestOutcome(intent.op_id, intent.provider, "rejected", code=code, detail=error.detail)


def _lease_lost(exc: Exception) -> bool:
    """A refusal because the lease was lost (not a halt, not a lost link): the same commit may go again once the
    lease is held again."""
    if isinstance(exc, ControllerRejected):
        return exc.reason in LEASE_LOST_REASONS
    return isinstance(exc, LeaseError) and not isinstance(exc, MutationsHalted)
