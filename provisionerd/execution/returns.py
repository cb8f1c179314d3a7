"""The executor's return flow: ``ReturnIntent`` through the gate, ``requestReturnMachines`` (or ``stopMachines``)
with op_id and owner tags, poll to completion, ``Returned``.

A mixin of :class:`provisionerd.executor.Executor`, split out to keep each module to one flow; it uses the
executor's clients, gate, leases and helpers. Returns hold no secret, so an unknown outcome is retried with the
same op_id, in process (``retries``) or later by the loop (``resume_return``). Every call, the first, a retry and
a resumed one, passes the gate as it starts (``executor_docs``, "Every call is gated"). A refused return leaves its intent
committed (the machines are ``RETURNING``) for the loop to resume once any back-off has passed. A machine the
final status reports ``fail`` stays ``RETURNING``; one the status leaves out was already gone (returning twice is
harmless by contract).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import trio

from provisionerd.domain.errors import ProviderError
from provisionerd.domain.model import NO_EPOCH, Returned, ReturnIntent
from provisionerd.execution.documents import return_input
from provisionerd.execution.values import GATE_ERRORS, ReturnOutcome, _Run
from provisionerd.planner.capacity import CallSucceeded
from provisionerd.planner.state import ActionDropped


class ReturnFlow:
    async def return_machines(
        self, provider: str, op_id: str, machine_ids: Sequence[str], reason: str, *, stop: bool = False
    ) -> ReturnOutcome:
        """Gate with a ``ReturnIntent``, call ``requestReturnMachines`` (``stopMachines`` with ``stop``), poll to
        completion, commit ``Returned``. Raises nothing: every failure is in the outcome."""
        ids = tuple(machine_ids)
        if not ids:
            raise ValueError("return_machines needs at least one machine id")
        if op_id in self.busy_ops or self.busy_machines.intersection(ids):
            return ReturnOutcome(op_id, provider, "dropped", code="busy")
        self.busy_ops.add(op_id)
        self.busy_machines.update(ids)
        run = _Run(self.observe)
        try:
            outcome = await self._return(run, provider, ReturnIntent(provider, NO_EPOCH, op_id, ids, reason), stop)
        finally:
            self.busy_ops.discard(op_id)
            self.busy_machines.difference_update(ids)
        return self._returned(run, outcome)

    async def resume_return(self, intent: ReturnIntent, *, stop: bool = False) -> ReturnOutcome:
        """Drive a committed return intent no task is running (unknown outcome, restart) with its own op_id."""
        ids = intent.machine_ids
        if intent.op_id in self.busy_ops or self.busy_machines.intersection(ids):
            return ReturnOutcome(intent.op_id, intent.provider, "dropped", code="busy")
        self.busy_ops.add(intent.op_id)
        self.busy_machines.update(ids)
        run = _Run(self.observe)
        try:
            outcome = await self._return(run, intent.provider, intent, stop)
        finally:
            self.busy_ops.discard(intent.op_id)
            self.busy_machines.difference_update(ids)
        return self._returned(run, outcome)

    def _returned(self, run: _Run, outcome: ReturnOutcome) -> ReturnOutcome:
        outcome = attrs.evolve(outcome, observations=tuple(run.observations))
        self._emit(
            "result",
            "return",
            outcome.op_id,
            outcome.provider,
            status=outcome.status,
            machines=len(outcome.returned),
            code=outcome.code,
            detail=outcome.detail,
        )
        return outcome

    def _names(self, ids: Sequence[str]) -> list[tuple[str, str]]:
        facts = self._facts()
        records = {} if facts is None else facts.machines
        return [(mid, records[mid].hostname if mid in records else "") for mid in ids]

    async def _return(self, run: _Run, provider: str, intent: ReturnIntent, stop: bool) -> ReturnOutcome:
        op_id, ids, s = intent.op_id, intent.machine_ids, self.settings
        client = self._clients.get(provider)
        if client is None:
            run.add(ActionDropped(op_id))
            return ReturnOutcome(op_id, provider, "dropped", code="unknown_provider")
        action = "stopMachines" if stop else "requestReturnMachines"
        started = trio.current_time()
        attempt = 0
        accepted: dict[str, Any] | None = None
        error: ProviderError | None = None
        while accepted is None:
            try:
                # Every call passes the gate as it starts, a retry and a resumed return too: the intent is
                # (re-)committed under the epoch held now (identical to the logged one if the epoch did not change,
                # so the controller just acknowledges it) and a lapsed lease stops the call.
                async with self._gate.mutation(provider, intent) as permit:
                    accepted, error = await self._call_return(client, action, provider, intent, permit.epoch)
            except GATE_ERRORS as exc:
                run.add(ActionDropped(op_id))
                self._gate_refused(run, provider, exc)
                return ReturnOutcome(op_id, provider, "dropped", code=self._gate_code(exc), detail=str(exc))
            if error is None:
                break
            if not error.outcome_unknown:
                self._observe_error(run, provider, "", error)
                # The intent stays committed (the machines are RETURNING); the loop resumes it later.
                return ReturnOutcome(
                    op_id, provider, "rejected", code=getattr(error, "code", type(error).__name__), detail=error.detail
                )
            if attempt >= s.retries:
                return ReturnOutcome(op_id, provider, "unknown", code=type(error).__name__, detail=error.detail)
            await trio.sleep(s.retry_delay * 2**attempt)
            attempt += 1
        run.add(CallSucceeded(provider))
        status = await self._poll(run, provider, str(accepted["requestId"]), started + s.return_timeout)
        if status is None or not status.final:
            return ReturnOutcome(op_id, provider, "unknown", code="return_timeout")
        listed = {m.machine_id: m for m in status.machines}
        # A machine the status leaves out was already gone (returned twice is harmless); "fail" stays RETURNING.
        done = tuple(mid for mid in ids if mid not in listed or listed[mid].result == "succeed")
        if done and not await self._commit_quietly(Returned(provider, NO_EPOCH, op_id, done)):
            return ReturnOutcome(op_id, provider, "unknown", code="commit_failed")
        if len(done) < len(ids):
            return ReturnOutcome(op_id, provider, "partial", done, code=status.status, detail=status.message)
        return ReturnOutcome(op_id, provider, "returned", done)

    async def _call_return(
        self, client: Any, action: str, provider: str, intent: ReturnIntent, epoch: Any
    ) -> tuple[dict[str, Any] | None, ProviderError | None]:
        document = return_input(self.settings.cluster, provider, intent.op_id, self._names(intent.machine_ids), epoch)
        self._emit(
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
            return await client.call(action, document), None
        except ProviderError as exc:
            return None, exc
