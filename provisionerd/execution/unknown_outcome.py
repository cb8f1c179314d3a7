"""The executor's path after a ``requestMachines`` whose outcome is unknown (timeout, crash, garbled answer, or
``provider_error`` that took effect): list the op by tag, then settle from the listing, or retry the same op_id
through the gate on an idempotent provider only. The rules and why: ``provisionerd.execution.call_rules`` ("Every
call is gated", "After an unknown outcome").

A collaborator of ``provisionerd.execution.request_flow.RequestFlow``, given the executor's ``FlowDeps`` (clients,
gate, facts, settings), the shared ``Steps`` (``list_op``, ``commit_instances``, ``refused``) and the executor's
``FeatureBook`` (each provider's ``describeProvider`` features, read once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from provisionerd.domain.errors import ProviderError, ProviderFailed, ProviderRejected
from provisionerd.domain.model import NO_EPOCH, ProviderMachine, RequestFailed, RequestIntent
from provisionerd.domain.tokens import IssuedToken
from provisionerd.execution.call_rules import assign_refs
from provisionerd.execution.observations import gate_code
from provisionerd.execution.op_book import OpRecord
from provisionerd.execution.provider_features import FeatureBook
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.values import GATE_ERRORS, RequestOutcome
from provisionerd.planner.capacity import CapacityUnavailable
from provisionerd.provider.values import RequestAccepted

log = logging.getLogger(__name__)


class UnknownOutcomeFlow:
    def __init__(self, deps: FlowDeps, steps: Steps, features: FeatureBook) -> None:
        self._deps = deps
        self._steps = steps
        self._features = features

    async def after_request_error(
        self,
        run: OpRecord,
        intent: RequestIntent,
        issued: Sequence[IssuedToken],
        error: ProviderError,
        deadline: float,
    ) -> tuple[RequestAccepted | None, RequestOutcome | None]:
        """Decide after a failed ``requestMachines`` (see ``call_rules`` "After an unknown outcome"): refuse, settle
        from the op's listing, or, on an idempotent provider only, retry the same op_id through the gate. Returns
        the accepted answer of a retry (to be polled) or the outcome that ends the request, never both."""
        op_id, provider, s = intent.op_id, intent.provider, self._deps.settings
        steps = self._steps
        code = error.code if isinstance(error, ProviderRejected) else ""
        if not error.outcome_unknown and not isinstance(error, ProviderFailed):
            return None, await steps.refused(run, intent, error)
        attempt = 0
        while True:
            found = await steps.list_op(provider, op_id)
            steps.emit(
                "recovery",
                "request",
                op_id,
                provider,
                error=type(error).__name__,
                code=code,
                found=None if found is None else len(found),
                attempt=attempt,
            )
            if not error.outcome_unknown and found == ():
                return None, await steps.refused(run, intent, error)  # provider_error and nothing made: refused
            if found and len(assign_refs(found, intent.instance_refs)) >= intent.count:
                return None, await self._settle_listed(intent, found)  # all made: calling again could only harm
            if not await self._idempotent(provider):
                return None, await self._settle_without_retry(run, intent, found, error)
            if self._deps.facts.epoch_now(provider) is None or attempt >= s.retries or trio.current_time() >= deadline:
                if found:
                    await steps.commit_instances(intent, found)
                return None, RequestOutcome(
                    op_id, provider, "unknown", code=code or type(error).__name__, detail=error.detail
                )
            if found:
                # Record what the listing showed before retrying: if every later listing and poll fails, these
                # machines would otherwise have no InstanceFact and stay unattributed (seed 3550).
                await steps.commit_instances(intent, found)
            await trio.sleep(s.retry_delay * 2**attempt)
            attempt += 1
            try:
                # Gated like the first call, at the moment it starts: a lease that lapsed during the sleep stops
                # it, and after a failover the intent is re-committed under the epoch held now.
                accepted, failed = await steps.gated_request(run, intent, issued, retry=attempt)
            except GATE_ERRORS as exc:
                # The intent stays open: recovery lists the op later and settles it (its tokens die with us).
                steps.gate_refused(run, provider, exc)
                return None, RequestOutcome(
                    op_id, provider, "unknown", code=gate_code(exc), detail=f"retry not admitted: {exc}"
                )
            if failed is None:
                return accepted, None
            error = failed
            code = error.code if isinstance(error, ProviderRejected) else ""
            if not error.outcome_unknown and not isinstance(error, ProviderFailed):
                if found is None:
                    # A retry refused says nothing about what the earlier call made, and no listing showed it: the
                    # intent stays open for recovery to list it later (never "nothing made"; seed 859785291).
                    steps.observe_error(run, provider, intent.template_id, error)
                    return None, RequestOutcome(
                        op_id, provider, "unknown", code="list_failed", detail=f"retry refused: {error.detail}"[:500]
                    )
                if found:
                    await steps.commit_instances(intent, found)
                return None, await steps.refused(run, intent, error)

    async def _idempotent(self, provider: str) -> bool:
        """Whether ``provider`` declares ``features.idempotentRequest``. A provider that cannot say is taken as not
        idempotent: the safe reading (asked again next time)."""
        features = await self._features.read(provider)
        return features is not None and features.idempotent_request

    async def _settle_listed(self, intent: RequestIntent, found: Sequence[ProviderMachine]) -> RequestOutcome:
        """Every machine of the op is listed: commit them, no further call."""
        committed = await self._steps.commit_instances(intent, found)
        if committed is None:
            return RequestOutcome(intent.op_id, intent.provider, "unknown", code="commit_failed")
        return RequestOutcome(intent.op_id, intent.provider, "fulfilled", committed)

    async def _settle_without_retry(
        self, run: OpRecord, intent: RequestIntent, found: Sequence[ProviderMachine] | None, error: ProviderError
    ) -> RequestOutcome:
        """A provider without idempotent requests: the same op_id again would create its machines again. Commit
        what the listing shows, fail the rest (the planner requests the shortfall as a new op with fresh tokens).
        When the listing itself failed nothing can be settled: the intent stays open for recovery."""
        op_id, provider = intent.op_id, intent.provider
        if found is None:
            return RequestOutcome(
                op_id, provider, "unknown", code="list_failed", detail=f"{type(error).__name__}: {error.detail}"
            )
        committed = await self._steps.commit_instances(intent, found)
        if committed is None:
            return RequestOutcome(op_id, provider, "unknown", code="commit_failed")
        reason = (
            f"outcome unknown ({type(error).__name__}) on a provider without idempotent requests: "
            f"{len(committed)} of {intent.count} found; not retried, the rest is a new op"
        )[:500]
        if not await self._deps.facts.commit_quietly(RequestFailed(provider, NO_EPOCH, op_id, reason)):
            return RequestOutcome(op_id, provider, "unknown", committed, code="commit_failed")
        if intent.all_or_nothing and committed:
            # An all-or-nothing op that made some of its machines is broken (planner.gang): they are returned and
            # the whole asked again, after the offer's capacity back-off, as for an answer in part
            # (request_flow._finish): asked again at once, the same offer would likely fall short again.
            run.add(CapacityUnavailable(provider, intent.template_id, self._deps.wall()))
        return RequestOutcome(op_id, provider, "partial", committed, code="not_idempotent", detail=reason)
