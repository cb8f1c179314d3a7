"""The rules every executor flow follows around a provider call, and the one pure helper they share (which
listed machine is which bootstrap: ``assign_refs``).

No I/O. The documents themselves are written and read by the typed provider client
(``provisionerd.provider.contract``): owner tags on every mutation, one bootstrap per machine.

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

from collections.abc import Sequence

from provisionerd.domain.model import ProviderMachine


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
