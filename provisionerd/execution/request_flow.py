"""The executor's request flow: one ``RequestMachines`` action from its tokens to its instance facts.

::

    instance_ref + fresh token per machine ──gate: RequestIntent(op_id, refs, token hashes) acked──>
    requestMachines(op_id, owner tags, bootstrap) ──> poll getRequestStatus (backoff, trio clock) ──>
    one InstanceFact per machine created (its ref's token hash), RequestFailed if fewer came

Failures:
- a typed refusal (``capacity_unavailable``, ``throttled``, ``quota_exceeded``, ``invalid_request``,
  ``auth_failed``) is an outcome known: ``RequestFailed`` is committed and the code becomes a planner observation
  (offer unavailable, throttle back-off, provider unhealthy: ``provisionerd.execution.observations``);
- an unknown outcome (``ProviderTimeout``, ``ProviderCrashed``, ``ProviderProtocolViolation``) lists the machines
  tagged with the op_id. If they are all there they are committed and nothing is called again. Otherwise only a
  provider declaring ``features.idempotentRequest`` gets a retry with the **same** op_id and the same tokens (the
  plugin answers the first attempt's request instead of creating more), through the gate again; on any other
  provider what exists is committed and the rest failed (``RequestFailed``), to be re-planned as a new op. See
  ``provisionerd.execution.call_rules`` ("Every call is gated", "After an unknown outcome") and
  ``UnknownOutcomeFlow``. ``provider_error`` is treated the same way when the listing shows the call took effect
  (the contract tells plugins to answer it when they do not know), and as a refusal when it shows nothing;
- a ``getRequestStatus`` that does not know the requestId ``requestMachines`` just answered (a foreign id: an
  ``unknown request``, or an answer about other ids only) is a protocol violation, not "nothing made": the op's
  listing by tag is committed, a shortfall leaves the intent open for recovery (nothing is requested for the
  demand meanwhile), and a provider that does it twice in a row is unhealthy (``protocol_violation``);
- a request still not complete at its provisioning deadline stops polling: whatever the provider made is listed by
  op tag and committed as instance facts, and the intent is left open, so the planner's provisioning timeout fails
  it and returns its machines.

**After a restart** (or a commit whose ack was lost) an intent can be open in the facts with no task running it.
Its tokens are gone (only their hashes were kept), so the same op_id cannot be retried: a retry that creates
machines would give them tokens no fact vouches for. ``recover`` therefore lists the op's machines, commits
instance facts for those that exist (they keep the tokens they booted with) and, when some are missing, commits
``RequestFailed`` so the planner requests the shortfall as a new op with fresh tokens. A machine of the old op
that appears later carries its op tag and no fact: the orphan scan reports it.

A **legacy LSF plugin** (``client.legacy``) is never listed nor retried after a failed ``requestMachines``: see
``provisionerd.execution.legacy_requests`` (an unknown outcome is committed as ``RequestFailed`` saying so, and
the planner re-plans the shortfall).

The flow holds no claim itself: the executor claims the op's record (``op_book``) before calling ``run`` or
``recover``, and the flow moves it through its stages. Join tokens
exist only inside ``run`` (and the same-op retry it hands them to): never in an event, a log line or an outcome.
"""

from __future__ import annotations

import logging

import attrs
import trio

from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.errors import ProviderProtocolViolation
from provisionerd.domain.model import NO_EPOCH, RequestFailed, RequestIntent
from provisionerd.domain.tokens import instance_refs, issue
from provisionerd.execution.call_rules import assign_refs
from provisionerd.execution.legacy_requests import LegacyRequestFlow
from provisionerd.execution.observations import gate_code
from provisionerd.execution.op_book import OpRecord, Stage
from provisionerd.execution.recovery_rules import CallRecord, OpAtRestart, Step, recover_request
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.unknown_outcome import UnknownOutcomeFlow
from provisionerd.execution.values import GATE_ERRORS, RequestOutcome
from provisionerd.planner.capacity import CallSucceeded, CapacityUnavailable
from provisionerd.planner.state import ActionDropped
from provisionerd.provider.values import RequestStatus

log = logging.getLogger(__name__)


class RequestFlow:
    def __init__(self, deps: FlowDeps, steps: Steps, unknown: UnknownOutcomeFlow, legacy: LegacyRequestFlow) -> None:
        self._deps = deps
        self._steps = steps
        self._unknown = unknown
        self._legacy = legacy

    async def run(self, run: OpRecord, action: RequestMachines) -> RequestOutcome:
        """Run one ``RequestMachines`` action to its end (see the module docstring). Raises nothing a provider or
        the gate raises: every failure is in the outcome."""
        op_id, provider, s, steps = action.op_id, action.provider, self._deps.settings, self._steps
        client = self._deps.clients.get(provider)
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
            action.reservation,
            action.release,
            action.price,
            action.all_or_nothing,
        )
        try:
            accepted, error = await steps.gated_request(run, intent, issued)
        except GATE_ERRORS as exc:
            steps.request_dropped(run, provider, op_id, exc)
            return RequestOutcome(op_id, provider, "dropped", code=gate_code(exc), detail=str(exc))
        deadline = started + s.request_timeout(provider)
        if error is not None and client.legacy:
            return await self._legacy.after_error(run, intent, client, error)
        if error is not None:
            accepted, outcome = await self._unknown.after_request_error(run, intent, issued, error, deadline)
            if outcome is not None:
                return outcome
        assert accepted is not None
        run.add(CallSucceeded(provider, op_id=op_id))
        # A call that answers at or after the op's deadline still has its answer read once: a legacy op whose
        # per-machine calls were answered but for a last one that hung past the deadline made machines that no
        # listing can show (seed 270 of the legacy worlds: failed unpolled, they ran with no fact).
        poll_until = max(deadline, trio.current_time() + s.poll_initial)
        try:
            status = await steps.poll(run, provider, accepted.request_id, poll_until, answered_by="requestMachines")
        except ProviderProtocolViolation as exc:
            return await self._foreign_id(run, intent, exc)
        steps.id_known(provider)
        run.enter(Stage.FACTS)
        if status is None or not status.final:
            return await self._timed_out(intent, status)
        return await self._finish(run, intent, status)

    async def _foreign_id(
        self, run: OpRecord, intent: RequestIntent, violation: ProviderProtocolViolation
    ) -> RequestOutcome:
        """The plugin does not know the requestId its own ``requestMachines`` answered (issue 31, finding 3): the
        call may have made every machine, so the outcome is unknown, never "nothing made". The op's listing by tag
        settles it: what it shows is committed; a shortfall leaves the intent open, so nothing is requested for the
        demand meanwhile and recovery lists the op again before the rest becomes a new op. The second violation in
        a row makes the provider unhealthy (``protocol_violation``), its reason naming the ids."""
        op_id, provider = intent.op_id, intent.provider
        detail = self._steps.foreign_id(run, provider, op_id, violation)
        found = await self._steps.list_op(provider, op_id)
        self._steps.emit(
            "recovery",
            "request",
            op_id,
            provider,
            error="foreign_request_id",
            found=None if found is None else len(found),
        )
        committed = await self._steps.commit_instances(intent, found) if found else ()
        if committed is not None and len(committed) >= intent.count:
            return RequestOutcome(op_id, provider, "fulfilled", committed, code="foreign_request_id", detail=detail)
        return RequestOutcome(op_id, provider, "unknown", committed or (), code="foreign_request_id", detail=detail)

    async def _finish(self, run: OpRecord, intent: RequestIntent, status: RequestStatus) -> RequestOutcome:
        made = [m for m in status.machines if m.result == "succeed"]
        committed = await self._steps.commit_instances(intent, made)
        op_id, provider = intent.op_id, intent.provider
        if committed is None:
            return RequestOutcome(op_id, provider, "unknown", code="commit_failed")
        if len(committed) >= intent.count:
            return RequestOutcome(op_id, provider, "fulfilled", committed)
        reason = f"partial: {len(committed)} of {intent.count} ({status.status}: {status.message})"[:500]
        await self._deps.facts.commit_quietly(RequestFailed(provider, NO_EPOCH, op_id, reason))
        if intent.all_or_nothing:
            # All or nothing, answered in part (planner.gang): the planner returns what was made and asks for the
            # whole again, after the offer's capacity back-off (asked again at once, it would answer in part again).
            run.add(CapacityUnavailable(provider, intent.template_id, self._deps.wall()))
        return RequestOutcome(op_id, provider, "partial", committed, code=status.status, detail=status.message)

    async def _timed_out(self, intent: RequestIntent, status: RequestStatus | None) -> RequestOutcome:
        """The provisioning deadline passed: explain what exists, leave the intent open for the planner."""
        found = await self._steps.list_op(intent.provider, intent.op_id)
        machines = found if found is not None else (status.machines if status is not None else ())
        committed = await self._steps.commit_instances(intent, machines)
        return RequestOutcome(intent.op_id, intent.provider, "timed_out", committed or (), code="provisioning_timeout")

    async def recover(self, intent: RequestIntent) -> RequestOutcome:
        """Settle an open intent no task is running (after a restart): every decision is the pure
        ``recovery_rules.recover_request`` of what is known (module docstring there), this carries it out: a legacy
        call still running is waited for, one whose outcome is unknown is failed saying so, anything else is
        listed by op tag and settled. ``intent``'s provider must be served (the executor checks)."""
        op_id, provider = intent.op_id, intent.provider
        client = self._deps.clients[provider]
        facts = self._deps.facts.view()
        record = facts.intents.get(op_id) if facts is not None else None
        known = record.machine_ids if record is not None else []
        committed = frozenset(facts.machines[m].instance_ref for m in known if m in facts.machines) if facts else None
        call = CallRecord.KNOWN
        if client.legacy and op_id in client.calls_running():
            call = CallRecord.RUNNING
        elif client.legacy and op_id in {u.op_id for u in client.unknown_outcomes()}:
            call = CallRecord.UNKNOWN
        op = OpAtRestart(intent.count, intent.instance_refs, committed or frozenset(), call)
        step = recover_request(op)
        if step.step is Step.WAIT:  # its answer will say what it made (the adapter collects it)
            self._steps.emit("recovery", "request", op_id, provider, waiting="call_running")
            return RequestOutcome(op_id, provider, "unknown", code="call_running")
        if step.step is Step.FAIL_UNKNOWN:
            settled = await self._legacy.settle_recovery(intent, client)
            if settled is not None:
                return settled
            return RequestOutcome(op_id, provider, "unknown", code="call_running")  # collected meanwhile: next pass
        found = await self._steps.list_op(provider, op_id)
        self._steps.emit("recovery", "request", op_id, provider, found=None if found is None else len(found))
        listing = None if found is None else tuple(ref for _, ref in assign_refs(found, intent.instance_refs))
        step = recover_request(attrs.evolve(op, listing=listing, listed=True))
        if step.step is not Step.SETTLE:  # RETRY_LATER: the listing failed; the intent stays open
            return RequestOutcome(op_id, provider, "unknown", code="list_failed")
        made = await self._steps.commit_instances(intent, found or ())
        if made is None:
            return RequestOutcome(op_id, provider, "unknown", code="commit_failed")
        if not step.shortfall:
            return RequestOutcome(op_id, provider, "fulfilled", made)
        have = intent.count - step.shortfall
        reason = f"recovered after restart: {have} of {intent.count} found; the rest is a new op"
        await self._deps.facts.commit_quietly(RequestFailed(provider, NO_EPOCH, op_id, reason))
        return RequestOutcome(op_id, provider, "partial", made, code="recovered")

    async def attribute_op(self, intent: RequestIntent, *, unlistable_as_empty: bool = False) -> tuple[str, ...] | None:
        """List ``intent``'s op and commit an InstanceFact for each machine found not in the facts yet; the machine
        ids (``None`` when the listing or a commit failed). Called before the op is failed: a machine a hung call
        created after the deadline would otherwise have no fact and stay unattributed."""
        if intent.provider not in self._deps.clients:
            return None
        found = await self._steps.list_op(intent.provider, intent.op_id, unlistable_as_empty=unlistable_as_empty)
        return None if found is None else await self._steps.commit_instances(intent, found)
