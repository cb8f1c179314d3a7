"""Pure helpers of the executor: the provider input documents it sends and the machines it reads back.

No I/O. Inputs follow the contract's schemas (``schemas/``): owner tags on every mutation, one bootstrap per
machine. Outputs have already passed the runtime's output schema; what is read here is only what the facts need.

Every call is gated
-------------------
Every provider mutation (``requestMachines``, ``requestReturnMachines``, ``stopMachines``) passes
``MutationGate.mutation`` at the moment it starts: the first call, each in-process retry after an unknown outcome
(after its back-off sleep, not before), and a return resumed by the loop. The gate takes the epoch held *now*
(``LeaseError`` when the lease lapsed, e.g. during the sleep) and commits the op's intent stamped with it, so the
provider is never called under an epoch no intent of that op carries (invariant 1). When the epoch did not change
the stamped intent equals the logged one and the controller acknowledges it with its existing index (no new
fact); after a failover it is a new fact — the same op under the new epoch — and the fact view keeps the first
intent per op_id (``FactView.apply``: ``RequestIntent`` by op_id, ``ReturnIntent`` by ``setdefault``), so the
re-stamp changes no record. A retry the gate refuses is not called: a request's intent stays open for
``recover_request``, a return's for ``resume_return``. This was chosen over abandoning every retry after an epoch
change because it is one rule for all calls and keeps the same-op retry an idempotent provider is owed.

After an unknown outcome (``requestMachines``)
----------------------------------------------
The op's machines are listed by op tag first, then:

1. the listing shows every machine the intent asked for: instance facts are committed, no further call;
2. the provider does not declare ``features.idempotentRequest`` (``describeProvider``, read once per provider and
   cached; a failed read counts as "not idempotent"): the same op_id is **never** sent again, because such a cloud
   creates the machines a second time. Instance facts are committed for what the listing shows, ``RequestFailed``
   for the rest, and the planner requests the shortfall as a new op with fresh tokens. A failed listing settles
   nothing: the intent stays open and ``recover_request`` lists it later;
3. only an idempotent provider gets the same-op_id retry (same tokens), gated as above, ``retries`` times at most
   and not past the provisioning deadline.

A refusal at the gate whose reason says the controller cannot take intents for now (``no_quorum``,
``not_primary``, a broken link: ``provisionerd.planner.state.BACKOFF_CODES``) is reported as ``IntentRefused``
besides ``ActionDropped`` (``provisionerd.execution.observations``): the loop plans nothing until the back-off
(1 s doubling to 30 s) ends, instead of replanning the same work at once under a fresh op_id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from provisionerd.domain.model import TAG_CLUSTER, TAG_EPOCH, TAG_INSTANCE, TAG_OP, TAG_PROVIDER, Epoch, ProviderMachine
from provisionerd.domain.tokens import IssuedToken

#: Request statuses after which ``getRequestStatus`` will not change any more.
FINAL_STATUSES = frozenset({"complete", "complete_with_error"})


def owner_tags(cluster: str, provider: str, op_id: str, epoch: Epoch) -> dict[str, str]:
    return {TAG_CLUSTER: cluster, TAG_PROVIDER: provider, TAG_OP: op_id, TAG_EPOCH: str(epoch)}


def request_input(
    cluster: str,
    provider: str,
    op_id: str,
    template_id: str,
    issued: Sequence[IssuedToken],
    controllers: Sequence[str],
    epoch: Epoch,
) -> dict[str, Any]:
    """The ``requestMachines`` input. It holds the join tokens: never log it, never keep it beyond the call."""
    return {
        "template": {"templateId": template_id, "machineCount": len(issued)},
        "op_id": op_id,
        "tags": owner_tags(cluster, provider, op_id, epoch),
        "bootstrap": [
            {"instanceRef": t.instance_ref, "controllers": list(controllers), "joinToken": t.token} for t in issued
        ],
    }


def return_input(
    cluster: str, provider: str, op_id: str, machines: Iterable[tuple[str, str]], epoch: Epoch
) -> dict[str, Any]:
    """The ``requestReturnMachines`` / ``stopMachines`` input; ``machines`` are ``(machine_id, name)`` pairs."""
    return {
        "machines": [{"name": name, "machineId": machine_id} for machine_id, name in machines],
        "op_id": op_id,
        "tags": owner_tags(cluster, provider, op_id, epoch),
    }


def op_filter(cluster: str, provider: str, op_id: str) -> dict[str, Any]:
    """The ``listMachines`` input that finds what ``op_id`` created."""
    return {"tags": {TAG_CLUSTER: cluster, TAG_PROVIDER: provider, TAG_OP: op_id}}


def _machine(entry: Mapping[str, Any]) -> ProviderMachine:
    tags = entry.get("tags") or {}
    return ProviderMachine(
        machine_id=str(entry["machineId"]),
        name=str(entry.get("name") or ""),
        result=str(entry.get("result", "succeed")),
        status=str(entry.get("status") or ""),
        launch_time=float(entry.get("launchtime") or 0),
        address=str(entry.get("privateIpAddress") or ""),
        instance_ref=str(entry.get("instanceRef") or tags.get(TAG_INSTANCE) or ""),
        tags={str(k): str(v) for k, v in tags.items()},
    )


@attrs.frozen
class RequestStatus:
    request_id: str
    status: str  # running | complete | complete_with_error
    message: str
    machines: tuple[ProviderMachine, ...]

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


def status_of(document: Mapping[str, Any], request_id: str) -> RequestStatus | None:
    """The entry for ``request_id`` in a ``getRequestStatus`` output (``None`` if the provider left it out)."""
    for entry in document.get("requests", ()):
        if entry.get("requestId") == request_id:
            return RequestStatus(
                request_id,
                str(entry.get("status")),
                str(entry.get("message") or ""),
                tuple(_machine(m) for m in entry.get("machines", ())),
            )
    return None


def listed_machines(document: Mapping[str, Any]) -> tuple[ProviderMachine, ...]:
    """The machines of a ``listMachines`` output."""
    return tuple(_machine(m) for m in document.get("machines", ()))


def assign_refs(machines: Sequence[ProviderMachine], refs: Sequence[str]) -> list[tuple[ProviderMachine, str]]:
    """Pair machines with the instance refs of their intent.

    A machine names its ref (``instanceRef`` or the ``provisionerd:instance`` tag); a machine that does not (a
    plugin that ignores the extension) gets the first ref nobody named, in order. Machines beyond the refs, or
    naming a ref twice, are left out: the intent asked for ``len(refs)`` machines, and what else carries the op's
    tag is for the orphan scan to judge.
    """
    known = set(refs)
    taken: set[str] = set()
    pairs: list[tuple[ProviderMachine, str]] = []
    unnamed: list[ProviderMachine] = []
    for machine in machines:
        ref = machine.instance_ref
        if ref in known and ref not in taken:
            taken.add(ref)
            pairs.append((machine, ref))
        elif not ref:
            unnamed.append(machine)
    free = [r for r in refs if r not in taken]
    pairs.extend(zip(unnamed, free, strict=False))
    return pairs
