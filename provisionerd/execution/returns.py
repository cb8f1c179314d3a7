"""The executor's return flow: ``ReturnIntent`` through the gate, ``requestReturnMachines`` (or ``stopMachines``)
with op_id and owner tags, poll to completion, ``Returned``.

A collaborator of :class:`provisionerd.execution.executor.Executor` (``return_machines``, ``resume_return``), given
the executor's ``FlowDeps`` and the shared ``Steps``. Returns hold no secret, so an unknown outcome is retried with
the same op_id, in process (``retries``) or later by the loop (``resume_return``). Every call, the first, a retry
and a resumed one, passes the gate as it starts (``provisionerd.execution.call_rules``, "Every call is gated"). A
refused return leaves its intent committed (the machines are ``RETURNING``) for the loop to resume once any
back-off has passed. A machine the final status reports ``fail`` stays ``RETURNING``; one the status leaves out was
already gone (returning twice is harmless by contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from provisionerd.domain.errors import ProviderError, ProviderProtocolViolation
from provisionerd.domain.model import NO_EPOCH, Epoch, Returned, ReturnIntent
from provisionerd.execution.observations import gate_code, refusal_code
from provisionerd.execution.op_book import OpRecord, Stage
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.values import GATE_ERRORS, ReturnOutcome
from provisionerd.planner.capacity import CallSucceeded
from provisionerd.planner.state import ActionDropped
from provisionerd.provider.client import ProviderClient
from provisionerd.provider.values import MachineRef, MachineReturn, OwnerTags, RequestAccepted


class ReturnFlow:
    def __init__(self, deps: FlowDeps, steps: Steps) -> None:
        self._deps = deps
        self._steps = steps

    async def run(self, run: OpRecord, intent: ReturnIntent, stop: bool) -> ReturnOutcome:
        """Drive ``intent`` to its end (see the module docstring). Raises nothing: every failure is in the
        outcome. The caller holds the busy claim on its op_id and machines."""
        op_id, provider, ids, s = intent.op_id, intent.provider, intent.machine_ids, self._deps.settings
        steps = self._steps
        client = self._deps.clients.get(provider)
        if client is None:
            run.add(ActionDropped(op_id))
            return ReturnOutcome(op_id, provider, "dropped", code="unknown_provider")
        action = "stopMachines" if stop else "requestReturnMachines"
        started = trio.current_time()
        attempt = 0
        accepted: RequestAccepted | None = None
        error: ProviderError | None = None
        while accepted is None:
            try:
                # Every call passes the gate as it starts, a retry and a resumed return too: the intent is
                # (re-)committed under the epoch held now (identical to the logged one if the epoch did not change,
                # so the controller just acknowledges it) and a lapsed lease stops the call.
                run.enter(Stage.INTENT)
                async with self._deps.gate.mutation(provider, intent) as permit:
                    run.enter(Stage.CALLING)
                    accepted, error = await self._call_return(client, action, provider, intent, permit.epoch)
            except GATE_ERRORS as exc:
                run.add(ActionDropped(op_id))
                steps.gate_refused(run, provider, exc)
                return ReturnOutcome(op_id, provider, "dropped", code=gate_code(exc), detail=str(exc))
            if error is None:
                break
            if not error.outcome_unknown:
                steps.observe_error(run, provider, "", error)
                # The intent stays committed (the machines are RETURNING); the loop resumes it later.
                return ReturnOutcome(op_id, provider, "rejected", code=refusal_code(error), detail=error.detail)
            run.enter(Stage.UNKNOWN)
            if attempt >= s.retries:
                return ReturnOutcome(op_id, provider, "unknown", code=type(error).__name__, detail=error.detail)
            await trio.sleep(s.retry_delay * 2**attempt)
            attempt += 1
        assert accepted is not None
        run.add(CallSucceeded(provider, "returnMachines"))
        try:
            status = await steps.poll(
                run, provider, accepted.request_id, started + s.return_timeout_of(provider), answered_by=action
            )
        except ProviderProtocolViolation as exc:
            # The plugin does not know the id it answered: whether the machines go is unknown. The intent stays
            # committed (the machines are RETURNING) and the loop resumes the return with the same op_id later
            # (returning twice is harmless); a plugin that keeps doing it turns unhealthy.
            detail = steps.foreign_id(run, provider, op_id, exc)
            return ReturnOutcome(op_id, provider, "unknown", code="foreign_request_id", detail=detail)
        steps.id_known(provider)
        if status is None or not status.final:
            return ReturnOutcome(op_id, provider, "unknown", code="return_timeout")
        run.enter(Stage.FACTS)
        listed = {m.machine_id: m for m in status.machines}
        # A machine the status leaves out was already gone (returned twice is harmless); "fail" stays RETURNING.
        done = tuple(mid for mid in ids if mid not in listed or listed[mid].result == "succeed")
        confirmed = Returned(provider, NO_EPOCH, op_id, done, self._deps.wall())
        if done and not await self._deps.facts.commit_quietly(confirmed):
            return ReturnOutcome(op_id, provider, "unknown", code="commit_failed")
        if len(done) < len(ids):
            return ReturnOutcome(op_id, provider, "partial", done, code=status.status, detail=status.message)
        return ReturnOutcome(op_id, provider, "returned", done)

    async def _call_return(
        self, client: ProviderClient, action: str, provider: str, intent: ReturnIntent, epoch: Epoch
    ) -> tuple[RequestAccepted | None, ProviderError | None]:
        request = MachineReturn(
            self._refs(intent.machine_ids), OwnerTags(self._deps.settings.cluster, provider, intent.op_id, epoch)
        )
        self._steps.emit(
            "called",
            "return",
            intent.op_id,
            provider,
            machines=len(intent.machine_ids),
            reason=intent.reason,
            epoch=epoch,
            call=action,
        )
        try:
            if action == "stopMachines":
                return await client.stop_machines(request), None
            return await client.request_return_machines(request), None
        except ProviderError as exc:
            return None, exc

    def _refs(self, ids: Sequence[str]) -> tuple[MachineRef, ...]:
        facts = self._deps.facts.view()
        records = {} if facts is None else facts.machines
        return tuple(MachineRef(mid, records[mid].hostname if mid in records else "") for mid in ids)
