"""Request -> reply for the simple request/response messages: the core's answers turned into wire messages.

Synchronous: each function asks the ``Cluster`` once and builds the reply. Messages with side effects on other
connections (demand, failover, host changes, resync) are handled in ``session.py``, which calls these for the rest.
"""

from __future__ import annotations

import math

from provisionerd.domain.model import CommittedFact, HostStatus
from provisionerd.wire.messages import (
    Ack,
    FactAck,
    FactCommit,
    Heartbeat,
    HeartbeatAck,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Message,
    Rejected,
)
from refcontroller.cluster import Cluster
from refcontroller.commits import INVALID, Rejection
from refcontroller.leases import NO_LEASE, Denied, Granted
from refcontroller.rules import RULES


def lease_reply(result: Granted | Denied) -> LeaseGrant | LeaseDenied:
    if isinstance(result, Granted):
        return LeaseGrant(result.lease.provider, result.lease.epoch, result.ttl_ms)
    return LeaseDenied(result.provider, result.reason, result.retry_after_ms)


def rejected(rejection: Rejection) -> Rejected:
    return Rejected(rejection.reason, rejection.detail)


def undeclared(provider: str) -> Rejected:
    return Rejected(INVALID, f"provider {provider!r} was not declared in this connection's Join")


def provisioner_reply(
    cluster: Cluster, replica: int, holder: str, providers: frozenset[str], msg: Message, now: float, wall: float = 0.0
) -> Message:
    """The reply to a heartbeat, lease operation or fact commit from the provisioner process ``holder``
    (``leases.holder_key`` of its Join: the lease holder and the sender of its facts). ``now``: the monotonic
    clock (leases); ``wall``: epoch seconds, a committed fact's time (``CommittedFact.committed_at``)."""
    match msg:
        case Heartbeat(seq=seq):
            return HeartbeatAck(seq, cluster.term)
        case LeaseAcquire(provider=provider) | LeaseRenew(provider=provider) | LeaseRelease(provider=provider) if (
            provider not in providers
        ):
            # Out of scope (``invalid``), not a denial of a lease that exists (protocol §5).
            return undeclared(provider) if RULES.lease_rules else LeaseDenied(provider, NO_LEASE)
        case LeaseAcquire(provider=provider):
            granted = cluster.acquire(replica, provider, holder, now)
            return rejected(granted) if isinstance(granted, Rejection) else lease_reply(granted)
        case LeaseRenew(provider=provider, epoch=epoch):
            return lease_reply(cluster.renew(replica, provider, holder, epoch, now))
        case LeaseRelease(provider=provider, epoch=epoch):
            rejection = cluster.release(replica, provider, holder, epoch, now)
            return Ack() if rejection is None else rejected(rejection)
        case FactCommit(fact=fact):
            if fact.provider not in providers:
                return undeclared(fact.provider)
            result = cluster.commit(replica, fact, holder, now, wall)
            if isinstance(result, CommittedFact):
                return FactAck(result.index, result.committed_at)
            return rejected(result)
    raise ValueError(f"not a simple provisioner request: {type(msg).__name__}")


def worker_status_valid(
    status: HostStatus,
    reclaim_at: float = 0.0,
    rebalance_at: float = 0.0,
    probed_at: float = 0.0,
    *,
    probed: bool = False,
) -> bool:
    """A worker reports idle or busy, and notice times that are finite and not negative (0 = none); a re-probe's
    report (``probed``: ``capabilities`` not empty) comes with the time it was made (``probed_at`` above 0)."""
    times_ok = all(math.isfinite(t) and t >= 0 for t in (reclaim_at, rebalance_at, probed_at))
    return status in (HostStatus.IDLE, HostStatus.BUSY) and times_ok and (probed_at > 0 or not probed)
