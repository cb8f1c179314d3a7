"""Whether a fact may be committed: shape checks, then the epoch rule. Pure functions; the caller writes the log.

The epoch rule (invariant 7): a fact is committed only if its epoch is the provider's *current* lease epoch, the
sender is that lease's holder (the same ``leases.holder_key``: identity *and* process instance), the quorum is
fresh and this replica is the primary. The rejection reasons are the wire's ``Rejected.reason`` codes, checked in
this order:

``not_primary``  this replica is a standby (decided by the caller)
``invalid``      the fact is malformed (see :func:`problems`); nothing about leases is looked at
``no_quorum``    the primary has no fresh quorum
``stale_epoch``  the provider has a live lease with another epoch, or the fact's epoch is older than the current
                 term or than the epoch on the provider's latest committed fact
``no_lease``     the provider has no live lease (and the epoch is not provably stale), or the sender is not its holder
``storage_failure``  every check passed but the store could not make the fact durable (``store.StoreFailure``:
                 disk full, I/O error); nothing was committed, and the link stays up (decided by the caller)

A fact equal to one already committed is acknowledged with the existing index (a retry whose ack was lost) once
the primary and quorum checks pass, whatever the current lease: it is in the log, and saying otherwise would lie.
"""

from __future__ import annotations

import json
import re

import attrs

from provisionerd.domain.model import (
    FACT_TYPES,
    DrainRequested,
    Fact,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from refcontroller.jsonconv import fact_to_json
from refcontroller.leases import Lease
from refcontroller.rules import RULES
from refcontroller.store import LatestFact

NOT_PRIMARY = "not_primary"
INVALID = "invalid"
NO_QUORUM = "no_quorum"
STALE_EPOCH = "stale_epoch"
NO_LEASE = "no_lease"
STORAGE_FAILURE = "storage_failure"

#: The largest fact (as JSON) the log accepts; big requests are split by the daemon. Keeps resync pages bounded.
MAX_FACT_BYTES = 256 * 1024
MAX_NAME = 256
ORPHAN_CLASSES = frozenset({"never_joined", "tagged_unknown", "ghost", "license"})
_HEX64 = re.compile(r"[0-9a-f]{64}")


@attrs.frozen
class Rejection:
    reason: str
    detail: str = ""


def problems(fact: Fact) -> list[str]:
    """Everything malformed about ``fact`` (empty when it is well formed)."""
    if not isinstance(fact, FACT_TYPES):
        return [f"not a fact: {type(fact).__name__}"]
    found: list[str] = []
    names = {"provider": fact.provider, "op_id": fact.op_id}
    names.update({k: getattr(fact, k) for k in ("instance_ref", "machine_id") if hasattr(fact, k)})
    for key, value in names.items():
        if not value or len(value) > MAX_NAME:
            found.append(f"{key} must be 1..{MAX_NAME} characters")
    if fact.epoch.term < 1 or fact.epoch.seq < 1:
        found.append(f"epoch {fact.epoch} is not a granted epoch")
    match fact:
        case RequestIntent():
            if fact.count < 1 or not len(fact.instance_refs) == len(fact.token_hashes) == fact.count:
                found.append("count, instance_refs and token_hashes must agree and be at least 1")
            if len(set(fact.instance_refs)) != len(fact.instance_refs) or not all(fact.instance_refs):
                found.append("instance_refs must be distinct and non-empty")
            if not all(_HEX64.fullmatch(h) for h in fact.token_hashes):
                found.append("token_hashes must be lowercase hex SHA-256 digests")
        case InstanceFact():
            if not _HEX64.fullmatch(fact.token_hash):
                found.append("token_hash must be a lowercase hex SHA-256 digest")
        case ReturnIntent() | Returned() | DrainRequested():
            if not fact.machine_ids or not all(fact.machine_ids):
                found.append("machine_ids must be non-empty")
        case OrphanReported():
            if fact.orphan_class not in ORPHAN_CLASSES:
                found.append(f"orphan_class must be one of {sorted(ORPHAN_CLASSES)}")
            try:
                json.loads(fact.evidence)
            except ValueError:
                found.append("evidence must be JSON text")
        case Lost() | OrphanAdopted():
            pass
    if len(fact_to_json(fact).encode()) > MAX_FACT_BYTES:
        found.append(f"the fact exceeds {MAX_FACT_BYTES} bytes as JSON; split the request")
    return found


def epoch_rejection(
    fact: Fact, *, sender: str, lease: Lease | None, term: int, latest: LatestFact | None
) -> Rejection | None:
    """The epoch rule for a well-formed fact. ``lease`` is the provider's *live* lease (``None`` if none)."""
    if lease is None:
        if fact.epoch.term < term or (latest is not None and fact.epoch < latest.epoch):
            return Rejection(STALE_EPOCH, f"epoch {fact.epoch} is older than term {term} or the latest fact")
        return Rejection(NO_LEASE, f"provider {fact.provider!r} has no live lease")
    if fact.epoch != lease.epoch and RULES.refuse_stale_epoch:
        return Rejection(STALE_EPOCH, f"epoch {fact.epoch} is not the current {lease.epoch}")
    if sender != lease.holder:
        return Rejection(NO_LEASE, f"the lease for {fact.provider!r} is held by another process")
    return None
