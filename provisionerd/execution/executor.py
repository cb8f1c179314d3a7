"""The executor: runs planned actions against a provider, every mutation through the mutation gate.

Request flow (``request``)::

    instance_ref + fresh token per machine ──gate: RequestIntent(op_id, refs, token hashes) acked──>
    requestMachines(op_id, owner tags, bootstrap) ──> poll getRequestStatus (backoff, trio clock) ──>
    one InstanceFact per machine created (its ref's token hash), RequestFailed if fewer came

Failures:
- a typed refusal (``capacity_unavailable``, ``throttled``, ``quota_exceeded``, ``invalid_request``,
  ``auth_failed``) is an outcome known: ``RequestFailed`` is committed and the code becomes a planner observation
  (offer unavailable, throttle back-off, provider paused);
- an unknown outcome (``ProviderTimeout``, ``ProviderCrashed``, ``ProviderProtocolViolation``) lists the machines
  tagged with the op_id. If they are all there they are committed and nothing is called again. Otherwise only a
  provider declaring ``features.idempotentRequest`` gets a retry with the **same** op_id and the same tokens (the
  plugin answers the first attempt's request instead of creating more), through the gate again; on any other
  provider what exists is committed and the rest failed (``RequestFailed``), to be re-planned as a new op. See
  ``executor_docs`` ("Every call is gated", "After an unknown outcome"). ``provider_error`` is treated the same way
  when the listing shows the call took effect (the contract tells plugins to answer it when they do not know),
  and as a refusal when it shows nothing;
- a request still not complete at its provisioning deadline stops polling: whatever the provider made is listed by
  op tag and committed as instance facts, and the intent is left open, so the planner's provisioning timeout fails
  it and returns its machines.

**After a restart** (or a commit whose ack was lost) an intent can be open in the facts with no task running it.
Its tokens are gone (only their hashes were kept), so the same op_id cannot be retried: a retry that creates
machines would give them tokens no fact vouches for. ``recover_request`` therefore lists the op's machines, commits
instance facts for those that exist (they keep the tokens they booted with) and, when some are missing, commits
``RequestFailed`` so the planner requests the shortfall as a new op with fresh tokens. A machine of the old op
that appears later carries its op tag and no fact: the orphan scan reports it.

A **legacy LSF plugin** (``client.legacy``) is never listed nor retried after a failed ``requestMachines``: see
``provisionerd.executor_legacy`` (an unknown outcome is committed as ``RequestFailed`` saying so, and the planner
re-plans the shortfall).

Return flow (``return_machines``): gate with ``ReturnIntent`` -> ``requestReturnMachines`` (or ``stopMachines``)
with op_id and tags -> poll -> ``Returned``. Returns hold no secret, so an unknown outcome (or a restart) is simply
retried with the same op_id (``resume_return``), each call through the gate.

The executor never runs two actions on one op_id or one machine at once (``busy_ops``, ``busy_machines``); a
conflicting call returns ``dropped`` at once. Planner observations go to ``observe`` (set by the loop) and are also
returned in the outcome. Join tokens never reach an event, a log line or an outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.errors import ControllerRejected, LeaseError, ProviderError
from provisionerd.domain.model import (
    NO_EPOCH,
    Fact,
    InstanceFact,
    ProviderMachine,
    RequestFailed,
    RequestIntent,
)
from provisionerd.domain.tokens import instance_refs, issue
from provisionerd.execution.documents import (
    RequestStatus,
    assign_refs,
    listed_machines,
    op_filter,
    request_input,
    status_of,
)
from provisionerd.execution.gate import LEASE_LOST_REASONS, FactCommitter, MutationGate
from provisionerd.execution.legacy_requests import LegacyRequestFlow, is_legacy
from provisionerd.execution.returns import ReturnFlow
from provisionerd.execution.unknown_outcome import UnknownOutcomeFlow
from provisionerd.execution.values import (
    DEFINITE_CODES,
    GATE_ERRORS,
    ExecutorSettings,
    RequestOutcome,
    ReturnOutcome,
    _Run,
)
from provisionerd.planner.capacity import CallSucceeded, CapacityUnavailable, QuotaExceeded, Throttled
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.state import BACKOFF_CODES, ActionDropped, IntentRefused, Observation
from provisionerd.telemetry.events import EventLog

__all__ = ["DEFINITE_CODES", "GATE_ERRORS", "Executor", "ExecutorSettings", "RequestOutcome", "ReturnOutcome"]

log = logging.getLogger(__name__)


class Executor(ReturnFlow, LegacyRequestFlow, UnknownOutcomeFlow):
    def __init__(
        self,
        settings: ExecutorSettings,
        clients: Mapping[str, Any],
        gate: MutationGate,
        leases: Mapping[str, LeaseKeeper],
        committer: FactCommitter,
        events: EventLog,
        *,
        facts: Callable[[], FactView | None] = lambda: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clients = clients
        self._gate = gate
        self._leases = leases
        self._committer = committer
        self._events = events
        self._facts = facts
        self._wall = wall
        self.observe: Callable[[Observation], None] = lambda obs: None
        self.busy_ops: set[str] = set()
        self.busy_machines: set[str] = set()
        self._features: dict[str, dict[str, Any]] = {}  # provider -> describeProvider's features, once read

    def client(self, provider: str) -> Any:
        """The provider client of ``provider`` (``KeyError`` if this daemon does not serve it)."""
        return self._clients[provider]

    # --- facts --------------------------------------------------------------------------------------------------

    async def commit_fact(self, fact: Fact) -> int:
        """Commit a non-mutating fact stamped with the current lease epoch; its log index.

        Raises ``LeaseError`` (no valid lease), ``ControllerRejected`` (a lease-lost rejection also lapses the
        keeper) or ``LinkDown`` (outcome unknown)."""
        keeper = self._leases.get(fact.provider)
        if keeper is None:
            raise LeaseError(fact.provider, "this daemon does not serve it")
        epoch = keeper.current()
        try:
            return await self._committer.commit(attrs.evolve(fact, epoch=epoch))
        except ControllerRejected as exc:
            if exc.reason in LEASE_LOST_REASONS:
                keeper.invalidate(epoch, f"fact rejected: {exc.reason}")
            raise

    async def _commit_quietly(self, fact: Fact) -> bool:
        try:
            await self.commit_fact(fact)
            return True
        except GATE_ERRORS as exc:
            log.warning("could not commit %s for %s: %s", type(fact).__name__, fact.op_id, exc)
            return False

    # --- helpers ------------------------------------------------------------------------------------------------

    def _emit(self, phase: str, kind: str, op_id: str, provider: str, **fields: Any) -> None:
        self._events.emit("action", phase=phase, kind=kind, op_id=op_id, provider=provider, **fields)

    def _epoch_now(self, provider: str):  # -> Epoch | None
        keeper = self._leases.get(provider)
        try:
            return None if keeper is None else keeper.current()
        except LeaseError:
            return None

    def _observe_error(self, run: _Run, provider: str, template_id: str, exc: ProviderError) -> None:
        code = getattr(exc, "code", "")
        at = self._wall()
        if code == "capacity_unavailable" and template_id:
            run.add(CapacityUnavailable(provider, template_id, at))
        elif code == "throttled":
            run.add(Throttled(provider, at))
        elif code == "quota_exceeded":
            run.add(QuotaExceeded(provider, at, getattr(exc, "message", "")))
            self._events.emit(
                "provider_paused", provider=provider, reason="quota_exceeded", detail=getattr(exc, "message", "")
            )

    async def _list_op(self, provider: str, op_id: str) -> tuple[ProviderMachine, ...] | None:
        """The live machines tagged with ``op_id`` (``None`` when the listing failed)."""
        try:
            document = await self._clients[provider].call(
                "listMachines", op_filter(self.settings.cluster, provider, op_id)
            )
        except ProviderError as exc:
            log.warning("listMachines for op %s failed: %s", op_id, exc)
            return None
        return listed_machines(document)

    async def _poll(self, run: _Run, provider: str, request_id: str, deadline: float) -> RequestStatus | None:
        """Poll until the request is final or ``deadline`` (trio clock) passes; the last status seen."""
        s = self.settings
        delay = s.poll_initial
        last: RequestStatus | None = None
        while True:
            wake = trio.current_time() + delay
            if wake > deadline:
                await trio.sleep_until(deadline)
                return last
            await trio.sleep_until(wake)
            try:
                document = await self._clients[provider].call(
                    "getRequestStatus", {"requests": [{"requestId": request_id}]}
                )
            except ProviderError as exc:
                self._observe_error(run, provider, "", exc)
                log.info("getRequestStatus %s failed: %s", request_id, exc)
            else:
                status = status_of(document, request_id)
                if status is not None:
                    last = status
                    if status.final:
                        return status
            delay = min(s.poll_max, delay * s.poll_multiplier)

    # --- requests -----------------------------------------------------------------------------------------------

    async def request(self, action: RequestMachines) -> RequestOutcome:
        """Run one ``RequestMachines`` action to its end (see the module docstring)."""
        if action.op_id in self.busy_ops:
            return RequestOutcome(action.op_id, action.provider, "dropped", code="busy")
        self.busy_ops.add(action.op_id)
        run = _Run(self.observe)
        try:
            outcome = await self._request(run, action)
        finally:
            self.busy_ops.discard(action.op_id)
        outcome = attrs.evolve(outcome, observations=tuple(run.observations))
        self._emit(
            "result",
            "request",
            action.op_id,
            action.provider,
            status=outcome.status,
            machines=len(outcome.machine_ids),
            code=outcome.code,
            detail=outcome.detail,
        )
        return outcome

    async def _request(self, run: _Run, action: RequestMachines) -> RequestOutcome:
        op_id, provider, s = action.op_id, action.provider, self.settings
        client = self._clients.get(provider)
        if client is None:
            run.add(ActionDropped(op_id))
            return RequestOutcome(op_id, provider, "dropped", code="unknown_provider")
        started = trio.current_time()
        issued = issue(instance_refs(op_id, action.count))
        intent = RequestIntent(
            provider,
            NO_EPOCH,
            op_id,
            action.template_id,
            action.count,
            tuple(t.instance_ref for t in issued),
            tuple(t.hash for t in issued),
            action.demand_id,
        )
        error: ProviderError | None = None
        accepted: dict[str, Any] | None = None
        try:
            async with self._gate.mutation(provider, intent) as permit:
                document = request_input(
                    s.cluster, provider, op_id, action.template_id, issued, s.controllers, permit.epoch
                )
                self._emit(
                    "called",
                    "request",
                    op_id,
                    provider,
                    template=action.template_id,
                    count=action.count,
                    epoch=permit.epoch,
                )
                try:
                    accepted = await client.call("requestMachines", document)
                except ProviderError as exc:
                    error = exc
        except GATE_ERRORS as exc:
            run.add(ActionDropped(op_id))
            self._gate_refused(run, provider, exc)
            return RequestOutcome(op_id, provider, "dropped", code=self._gate_code(exc), detail=str(exc))
        deadline = started + s.provisioning_timeout
        if error is not None and is_legacy(client):
            return await self._legacy_after_error(run, intent, client, error)
        if error is not None:
            accepted, outcome = await self._after_request_error(run, action, intent, issued, error, deadline)
            if outcome is not None:
                return outcome
        assert accepted is not None
        run.add(CallSucceeded(provider))
        status = await self._poll(run, provider, str(accepted["requestId"]), deadline)
        if status is None or not status.final:
            return await self._timed_out(intent, status)
        return await self._finish(intent, status)

    def _gate_code(self, exc: Exception) -> str:
        return exc.reason if isinstance(exc, ControllerRejected) else type(exc).__name__

    def _gate_refused(self, run: _Run, provider: str, exc: Exception) -> None:
        """Tell the planner the controller would not take an intent now, so it backs off before planning the
        same work again (``plannerstate.IntentRefused``)."""
        code = self._gate_code(exc)
        if code in BACKOFF_CODES:
            run.add(IntentRefused(provider, code, self._wall()))

    async def _refused(self, run: _Run, intent: RequestIntent, error: ProviderError) -> RequestOutcome:
        code = getattr(error, "code", "") or type(error).__name__
        self._observe_error(run, intent.provider, intent.template_id, error)
        await self._commit_quietly(RequestFailed(intent.provider, NO_EPOCH, intent.op_id, code))
        return RequestOutcome(intent.op_id, intent.provider, "rejected", code=code, detail=error.detail)

    async def _commit_instances(
        self, intent: RequestIntent, machines: Sequence[ProviderMachine]
    ) -> tuple[str, ...] | None:
        """Commit an InstanceFact per machine of ``intent`` not in the facts yet; the machine ids committed
        (``None`` when a commit failed: the rest is left to recovery)."""
        known = self._facts()
        hashes = dict(zip(intent.instance_refs, intent.token_hashes))
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
            )
            if not await self._commit_quietly(fact):
                return None
            committed.append(machine.machine_id)
        return tuple(committed)

    async def attribute_op(self, intent: RequestIntent) -> tuple[str, ...] | None:
        """List ``intent``'s op and commit an InstanceFact for each machine found not in the facts yet; the machine
        ids (``None`` when the listing or a commit failed). Called before the op is failed: a machine a hung call
        created after the deadline would otherwise have no fact and stay unattributed."""
        if intent.provider not in self._clients:
            return None
        found = await self._list_op(intent.provider, intent.op_id)
        return None if found is None else await self._commit_instances(intent, found)

    async def _finish(self, intent: RequestIntent, status: RequestStatus) -> RequestOutcome:
        made = [m for m in status.machines if m.result == "succeed"]
        committed = await self._commit_instances(intent, made)
        op_id, provider = intent.op_id, intent.provider
        if committed is None:
            return RequestOutcome(op_id, provider, "unknown", code="commit_failed")
        if len(committed) >= intent.count:
            return RequestOutcome(op_id, provider, "fulfilled", committed)
        reason = f"partial: {len(committed)} of {intent.count} ({status.status}: {status.message})"[:500]
        await self._commit_quietly(RequestFailed(provider, NO_EPOCH, op_id, reason))
        return RequestOutcome(op_id, provider, "partial", committed, code=status.status, detail=status.message)

    async def _timed_out(self, intent: RequestIntent, status: RequestStatus | None) -> RequestOutcome:
        """The provisioning deadline passed: explain what exists, leave the intent open for the planner."""
        found = await self._list_op(intent.provider, intent.op_id)
        machines = found if found is not None else (status.machines if status is not None else ())
        committed = await self._commit_instances(intent, machines)
        return RequestOutcome(intent.op_id, intent.provider, "timed_out", committed or (), code="provisioning_timeout")

    async def recover_request(self, intent: RequestIntent) -> RequestOutcome:
        """Settle an open intent no task is running (after a restart): see the module docstring."""
        op_id, provider = intent.op_id, intent.provider
        if op_id in self.busy_ops or provider not in self._clients:
            return RequestOutcome(op_id, provider, "dropped", code="busy")
        self.busy_ops.add(op_id)
        try:
            if is_legacy(self._clients[provider]):
                settled = await self.settle_legacy_recovery(intent, self._clients[provider])
                if settled is not None:
                    return settled
            found = await self._list_op(provider, op_id)
            self._emit("recovery", "request", op_id, provider, found=None if found is None else len(found))
            if found is None:
                return RequestOutcome(op_id, provider, "unknown", code="list_failed")
            committed = await self._commit_instances(intent, found)
            if committed is None:
                return RequestOutcome(op_id, provider, "unknown", code="commit_failed")
            facts = self._facts()
            have = set(committed)
            if facts is not None and op_id in facts.intents:
                have |= set(facts.intents[op_id].machine_ids)
            if len(have) >= intent.count:
                return RequestOutcome(op_id, provider, "fulfilled", committed)
            reason = f"recovered after restart: {len(have)} of {intent.count} found; the rest is a new op"
            await self._commit_quietly(RequestFailed(provider, NO_EPOCH, op_id, reason))
            return RequestOutcome(op_id, provider, "partial", committed, code="recovered")
        finally:
            self.busy_ops.discard(op_id)
