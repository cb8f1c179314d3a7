"""The executor's request path for a legacy LSF plugin (``client.legacy``): what replaces the list-and-retry.

A collaborator of ``provisionerd.execution.request_flow.RequestFlow`` (given the executor's ``FlowDeps`` and
``Steps``). A legacy plugin has no ``op_id`` idempotency and no listing, so after a failed ``requestMachines`` the
decision is ``provisionerd.provider.legacy.rules.after_request_error``:

- ``UNKNOWN_OUTCOME`` (timeout, crash, a garbled answer, or the adapter's own ``ProviderOutcomeUnknown``): the
  call is **never** retried and nothing is listed (there is nothing to list). A requestId the plugin printed before
  it hung never gets here: the adapter turns it into an accepted call, and the executor polls it like any other.
  Without one the outcome stays unknown: ``RequestFailed`` is committed with a reason that says so and why, a
  ``request_outcome_unknown`` event is written, and the planner re-plans the shortfall as a new op (fresh tokens).
  Whatever the lost call may have made is invisible to the daemon; the orphan report lists the op among the
  adapter's ``unknown_outcomes()``.
- ``RETRY_LATER`` / ``FAILED``: a refusal whose outcome is known, handled like any provider's (``Steps.refused``:
  the code becomes a planner observation such as the throttle back-off).

``settle_recovery`` is the restart path (``request_flow.RequestFlow.recover``, when ``recovery_rules`` says
``FAIL_UNKNOWN``): an open intent whose journal records an unknown call is failed the same way instead of being
polled for a listing the plugin cannot give.
"""

from __future__ import annotations

from provisionerd.domain.errors import ProviderError, ProviderOutcomeUnknown
from provisionerd.domain.model import NO_EPOCH, RequestFailed, RequestIntent
from provisionerd.execution.op_book import OpRecord
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.values import RequestOutcome
from provisionerd.provider.client import ProviderClient
from provisionerd.provider.legacy.rules import NextStep, after_request_error
from provisionerd.provider.values import Features

#: The longest ``RequestFailed.reason`` written (the rest of a plugin's message is in the event).
MAX_REASON = 500


def unknown_reason(error: ProviderError) -> str:
    """The ``RequestFailed`` reason for a legacy request whose outcome is unknown."""
    return (
        f"outcome unknown: {type(error).__name__}: {error.detail}; not retried (a legacy LSF plugin has no "
        "idempotency and no listing, so a retry could make the machines twice); any machines it made are "
        "invisible, see the orphan report"
    )[:MAX_REASON]


class LegacyRequestFlow:
    def __init__(self, deps: FlowDeps, steps: Steps) -> None:
        self._deps = deps
        self._steps = steps

    async def after_error(
        self, run: OpRecord, intent: RequestIntent, client: ProviderClient, error: ProviderError
    ) -> RequestOutcome:
        """The end of a legacy request whose ``requestMachines`` raised ``error`` (see the module docstring)."""
        # A legacy client knows its features without a call (the adapter's, all false): never None here.
        step = after_request_error(error, (client.known_features or Features()).as_mapping())
        if step is NextStep.UNKNOWN_OUTCOME:
            return await self._settle_unknown(intent, error)
        return await self._steps.refused(run, intent, error)

    async def _settle_unknown(self, intent: RequestIntent, error: ProviderError) -> RequestOutcome:
        """Fail the op, first committing what its answered calls made (a per-machine op may have had some answered
        before one was lost: failed unlisted, their machines would run with no fact; the adapter lists them).

        A listing that fails (the plugin crashed reading its requests) fails nothing: the intent stays open and
        recovery settles it on a later pass (seed 741613929 of the legacy worlds: a daemon restarted while its
        plugin crashed failed the op unlisted, and the two machines its answered calls made ran with no fact)."""
        found = await self._steps.list_op(intent.provider, intent.op_id, unlistable_as_empty=True)
        if found is None:
            return RequestOutcome(intent.op_id, intent.provider, "unknown", code="list_failed")
        made = await self._steps.commit_instances(intent, found) if found else ()
        reason = unknown_reason(error)
        self._deps.events.emit(
            "request_outcome_unknown",
            provider=intent.provider,
            op_id=intent.op_id,
            template=intent.template_id,
            count=intent.count,
            error=type(error).__name__,
            detail=error.detail,
            retried=False,
        )
        committed = await self._deps.facts.commit_quietly(
            RequestFailed(intent.provider, NO_EPOCH, intent.op_id, reason)
        )
        return RequestOutcome(
            intent.op_id,
            intent.provider,
            "unknown",
            made or (),
            code="outcome_unknown" if committed and made is not None else "commit_failed",
            detail=reason,
        )

    async def settle_recovery(self, intent: RequestIntent, client: ProviderClient) -> RequestOutcome | None:
        """After a restart: an open intent of a legacy plugin whose journal records a call with an unknown
        outcome can never be settled by a listing, so it is failed now (``None`` when the journal does not say
        so: then the ordinary recovery reads the op's machines through the adapter)."""
        unknown = {u.op_id: u for u in client.unknown_outcomes()}
        if intent.op_id not in unknown:
            return None
        detail = unknown[intent.op_id].detail or "the call's outcome is unknown"
        error = ProviderOutcomeUnknown(intent.provider, "requestMachines", f"found after a restart: {detail}")
        return await self._settle_unknown(intent, error)
