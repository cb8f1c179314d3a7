"""A seeded stand-in for the provisioning lifecycle: provider mutations through the real mutation gate.

Until the daemon's own lifecycle (``execution/executor.py`` + ``execution/loop.py``) is plugged in (see
``lifecycle.py``), this is what makes the simulated daemons touch the provider, so that every lease, gate and
controller invariant is exercised under faults. Every few virtual seconds a daemon instance with a valid lease:

- requests 1..3 machines under a fresh op_id (``RequestIntent`` through ``gate.mutation``, then
  ``requestMachines`` with the owner tags and one seeded join token per machine; only the SHA-256 leaves the
  daemon), polls the request and commits an ``InstanceFact`` per machine under the epoch it holds then;
- or returns 1..2 of the provider's machines that its controller view has facts for (``ReturnIntent`` through
  the gate, ``requestReturnMachines``, ``Returned``);
- or, first, resolves a request whose outcome it does not know (timeout, crash, garbage answer): it looks for the
  op_id's tag in ``listMachines`` and only when nothing carries it retries through the gate with the *same* op_id,
  and only on a cloud with client tokens (``features.idempotentRequest``). On a cloud without them an empty listing
  does not prove that nothing was made (the machine may have been made and have vanished since: the listing omits
  terminated machines), so the op is settled as it stands and a later request makes up the shortfall under a new
  op_id, as the executor does.

Everything random (op_ids, tokens, choices, pauses) comes from the ``random.Random`` it is given.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

import trio

from provisionerd.domain.errors import ControllerRejected, LeaseError, LinkDown, ProviderError, ProviderRejected
from provisionerd.domain.model import (
    NO_EPOCH,
    TAG_CLUSTER,
    TAG_OP,
    TAG_PROVIDER,
    Epoch,
    InstanceFact,
    ListedMachine,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.provider.values import Bootstrap, MachineRef, MachineRequest, MachineReturn, OwnerTags

#: Provider call timeout for the driver's calls (seconds); a ``hang`` fault takes this long.
CALL_TIMEOUT = 30.0
GATE_ERRORS = (LeaseError, ControllerRejected, LinkDown)


class GateDriver:
    #: Test-only seeded bug: retry an unknown outcome at once with the same op_id, without looking for the op_id's
    #: machines first or asking whether the cloud honours the op_id as a client token.
    skip_listing = False

    def __init__(
        self,
        node: Any,
        rng: random.Random,
        *,
        provider: str,
        template: str,
        cluster: str,
        controllers: tuple[str, ...],
        pace: float = 8.0,
        idempotent: bool = True,
    ) -> None:
        self.node = node
        self.rng = rng
        self.provider = provider
        self.template = template
        self.cluster = cluster
        self.controllers = controllers
        self.pace = pace
        #: What the cloud's ``describeProvider`` declares as ``features.idempotentRequest`` (the world knows it; the
        #: executor asks once): whether the same op_id again is safe.
        self.idempotent = idempotent
        self.incarnation = f"{rng.getrandbits(24):06x}"
        self.counter = 0
        self.unknown: dict[str, RequestIntent] = {}  # op_id -> intent whose request outcome is unknown

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        keeper = self.node.core.keepers[self.provider]
        while True:
            await trio.sleep(self.pace * (0.2 + self.rng.random()))
            if not keeper.valid():
                continue
            if self.unknown:
                await self._resolve(sorted(self.unknown)[0])
            elif self.rng.random() < 0.65:
                await self._request()
            else:
                await self._return()

    # --- requests --------------------------------------------------------------------------------------------------

    def _owner(self, op_id: str, epoch: Epoch) -> OwnerTags:
        return OwnerTags(self.cluster, self.provider, op_id, epoch)

    async def _request(self) -> None:
        self.counter += 1
        op_id = f"{self.node.identity}.{self.incarnation}.{self.counter}"
        count = self.rng.randint(1, 3)
        tokens = [f"{self.rng.getrandbits(128):032x}" for _ in range(count)]
        intent = RequestIntent(
            provider=self.provider,
            epoch=NO_EPOCH,
            op_id=op_id,
            template_id=self.template,
            count=count,
            instance_refs=tuple(f"{op_id}.{i}" for i in range(count)),
            token_hashes=tuple(hashlib.sha256(t.encode()).hexdigest() for t in tokens),
        )
        await self._send_request(intent, tokens)

    async def _send_request(self, intent: RequestIntent, tokens: list[str]) -> None:
        self.node.tokens[intent.op_id] = tokens
        try:
            async with self.node.core.gate.mutation(self.provider, intent) as permit:
                request = MachineRequest(
                    intent.template_id,
                    self._owner(intent.op_id, permit.epoch),
                    tuple(
                        Bootstrap(ref, tuple(self.controllers), token)
                        for ref, token in zip(intent.instance_refs, tokens, strict=True)
                    ),
                )
                try:
                    reply = await self.node.provider.request_machines(request, timeout=CALL_TIMEOUT)
                except ProviderError as exc:
                    if not isinstance(exc, ProviderRejected):
                        self.unknown[intent.op_id] = intent  # it may have happened: find out before retrying
                    return
        except GATE_ERRORS:
            return  # nothing called; a committed intent without machines is explained by itself
        self.unknown.pop(intent.op_id, None)
        await self._record_machines(intent, reply.request_id)

    async def _record_machines(self, intent: RequestIntent, request_id: str) -> None:
        try:
            statuses = await self.node.provider.get_request_status([request_id], timeout=CALL_TIMEOUT)
        except ProviderError:
            self.unknown[intent.op_id] = intent
            return
        machines = [m for r in statuses for m in r.machines]
        await self._commit_instances(intent, machines)

    async def _commit_instances(self, intent: RequestIntent, machines: Sequence[ListedMachine]) -> None:
        hashes = dict(zip(intent.instance_refs, intent.token_hashes, strict=True))
        keeper = self.node.core.keepers[self.provider]
        for m in machines:
            ref = m.instance_ref
            if ref not in hashes:
                continue
            try:
                epoch = keeper.current()
                await self.node.core.ops.commit(
                    InstanceFact(
                        provider=self.provider,
                        epoch=epoch,
                        op_id=intent.op_id,
                        instance_ref=ref,
                        machine_id=m.machine_id,
                        template_id=intent.template_id,
                        token_hash=hashes[ref],
                        hostname=m.name,
                        address=m.address,
                    )
                )
            except GATE_ERRORS:
                return

    async def _resolve(self, op_id: str) -> None:
        intent = self.unknown[op_id]
        if not self.skip_listing:
            try:
                listed = await self.node.provider.list_machines(
                    {TAG_CLUSTER: self.cluster, TAG_OP: op_id}, timeout=CALL_TIMEOUT
                )
            except ProviderError:
                return
            if listed or not self.idempotent:
                # Without client tokens the same op_id again creates again, and an empty listing may only mean its
                # machines vanished: settle the op with what lives; the next request is a new op.
                del self.unknown[op_id]
                await self._commit_instances(intent, listed)
                return
        await self._send_request(intent, self.node.tokens[op_id])

    # --- returns ---------------------------------------------------------------------------------------------------

    async def _return(self) -> None:
        try:
            listed = await self.node.provider.list_machines(
                {TAG_CLUSTER: self.cluster, TAG_PROVIDER: self.provider}, timeout=CALL_TIMEOUT
            )
        except ProviderError:
            return
        # Only machines the controller's facts explain, as the daemon's planner returns: a tagged machine with no
        # fact behind it is an orphan, the orphan policy's (after its grace), never a return of the lifecycle; a
        # daemon that never saw a lost store's incarnation (a twin on another host) cannot tell it from one of its own.
        view = self.node.core.session.view
        explained = view.facts.machines if view is not None else {}
        machines = sorted((m for m in listed if m.machine_id in explained), key=lambda m: m.machine_id)
        if not machines:
            return
        chosen = self.rng.sample(machines, min(len(machines), self.rng.randint(1, 2)))
        self.counter += 1
        op_id = f"{self.node.identity}.{self.incarnation}.{self.counter}"
        ids = tuple(m.machine_id for m in chosen)
        intent = ReturnIntent(provider=self.provider, epoch=NO_EPOCH, op_id=op_id, machine_ids=ids, reason="idle")
        try:
            async with self.node.core.gate.mutation(self.provider, intent) as permit:
                request = MachineReturn(
                    tuple(MachineRef(m.machine_id, m.name) for m in chosen), self._owner(op_id, permit.epoch)
                )
                await self.node.provider.request_return_machines(request, timeout=CALL_TIMEOUT)
        except (*GATE_ERRORS, ProviderError):
            return
        try:
            epoch = self.node.core.keepers[self.provider].current()
            await self.node.core.ops.commit(Returned(self.provider, epoch, op_id, ids))
        except GATE_ERRORS:
            return
