"""The per-provider lease table of one primary in one term. In memory only: a failover starts an empty table.

Rules (seed Q3; times are the controller's monotonic clock, in seconds):

- A grant carries ``epoch = Epoch(term, seq)``; ``seq`` grows by one per grant in this table, so epochs are unique
  and, because a later term is larger, they grow across failovers too.
- Nothing is granted or renewed unless the caller says the quorum is fresh (``no_quorum``).
- A lease lives until ``expires_at = (time of the last grant or renew) + ttl``; from ``expires_at`` on it is gone,
  whatever its holder believes. A holder counts its own deadline from when it *sent* the request, which is earlier,
  so the holder always gives up first.
- **Grace after promotion.** Until ``promoted_at + ttl + check_interval`` this primary cannot know whether a lease
  granted by the previous primary is still believed valid by its holder, so it grants a provider only to the holder
  it was last granted to (durable in the store; the caller passes it as ``previous_holder``); anyone else is
  denied ``grace`` with the time left. That holder is re-granted at once, with a new epoch of this term.
- Acquire by the holder of a live lease is idempotent: the same epoch, renewed. Acquire while another holder's
  lease is live is denied ``held`` with the time until it expires.
- Renew needs a live lease (else ``no_lease``: it expired or was never granted by this primary), its epoch (else
  ``stale_epoch``) and its holder (else ``held``).
- Release with the current epoch and holder ends the lease at once; anything else changes nothing.

A *holder* is a process, not a configured name: ``holder_key(identity, instance)`` of the provisioner's ``Join``.
Two live daemons with the same identity (the same config on two hosts) have different instances, so they are two
holders and never share an epoch; a daemon that rejoins keeps its instance and stays the holder; a restarted one is a
new holder and waits for its previous start's lease to expire (or the grace to end).
"""

from __future__ import annotations

import attrs

from provisionerd.domain.model import Epoch
from refcontroller.rules import RULES

#: Denial reasons (the wire's ``LeaseDenied.reason``; ``not_primary`` is decided before the table is asked).
HELD = "held"
GRACE = "grace"
NO_QUORUM = "no_quorum"
STALE_EPOCH = "stale_epoch"
NO_LEASE = "no_lease"

#: The longest ``Join.instance`` accepted (provisionerd sends 16 hex characters).
MAX_INSTANCE = 64
#: Separates identity and instance in a holder key; an instance may not contain it, so the key names one process.
HOLDER_SEP = "#"


def holder_key(identity: str, instance: str) -> str:
    """The lease holder a provisioner's ``Join`` names: ``identity#instance``, or ``identity`` alone for a client
    that sends no instance (an older one). Used for leases, the durable last grantee and the facts' ``holder``."""
    return f"{identity}{HOLDER_SEP}{instance}" if instance else identity


def instance_problem(identity: str, instance: str) -> str | None:
    """Why a provisioner's ``(identity, instance)`` cannot name a lease holder, or ``None`` if it can.

    The instance must be at most ``MAX_INSTANCE`` printable characters without ``#``. A client without an instance
    may not have ``#`` in its identity: its key would be indistinguishable from another process's
    ``identity#instance``.
    """
    if len(instance) > MAX_INSTANCE or not instance.isprintable() or HOLDER_SEP in instance:
        return f"instance must be at most {MAX_INSTANCE} printable characters without {HOLDER_SEP!r}"
    if not instance and HOLDER_SEP in identity:
        return f"an identity with {HOLDER_SEP!r} needs an instance"
    return None


@attrs.frozen
class Lease:
    provider: str
    holder: str
    epoch: Epoch
    expires_at: float


@attrs.frozen
class Granted:
    lease: Lease
    ttl: float

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl * 1000)


@attrs.frozen
class Denied:
    """``retry_after`` is a hint in seconds (0 when there is no useful one)."""

    provider: str
    reason: str
    retry_after: float = 0.0

    @property
    def retry_after_ms(self) -> int:
        return max(0, int(self.retry_after * 1000 + 0.999))


@attrs.define(eq=False)
class LeaseTable:
    term: int
    promoted_at: float
    ttl: float
    check_interval: float
    seq: int = 0
    _leases: dict[str, Lease] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.ttl <= 0 or self.check_interval < 0:
            raise ValueError(f"ttl must be > 0 and check_interval >= 0, not {self.ttl!r}, {self.check_interval!r}")

    @property
    def grace_ends_at(self) -> float:
        return self.promoted_at + self.ttl + self.check_interval

    def live(self, provider: str, now: float) -> Lease | None:
        """The provider's lease if it has not expired at ``now``."""
        lease = self._leases.get(provider)
        return lease if lease is not None and now < lease.expires_at else None

    def live_leases(self, now: float) -> list[Lease]:
        return sorted(
            (lease for lease in self._leases.values() if now < lease.expires_at), key=lambda lease: lease.provider
        )

    def acquire(
        self, provider: str, holder: str, now: float, *, quorum_fresh: bool, previous_holder: str | None
    ) -> Granted | Denied:
        """Grant ``provider`` to ``holder`` or say why not. ``previous_holder``: its last grantee."""
        if not quorum_fresh:
            return Denied(provider, NO_QUORUM, self.check_interval)
        current = self.live(provider, now)
        if current is not None:
            if current.holder != holder:
                return Denied(provider, HELD, current.expires_at - now)
            return self._extend(current, now)
        if now < self.grace_ends_at and holder != previous_holder and RULES.grace_after_promotion:
            return Denied(provider, GRACE, self.grace_ends_at - now)
        self.seq += 1
        lease = Lease(provider, holder, Epoch(self.term, self.seq), now + self.ttl)
        self._leases[provider] = lease
        return Granted(lease, self.ttl)

    def withdraw(self, lease: Lease) -> None:
        """Take back a grant that was never answered (its grantee could not be recorded). Its ``seq`` is not given
        again: epochs only grow, even past one nobody was told of."""
        if self._leases.get(lease.provider) == lease:
            del self._leases[lease.provider]

    def renew(self, provider: str, holder: str, epoch: Epoch, now: float, *, quorum_fresh: bool) -> Granted | Denied:
        if not quorum_fresh:
            return Denied(provider, NO_QUORUM, self.check_interval)
        current = self.live(provider, now)
        if current is None:
            return Denied(provider, NO_LEASE)
        if current.epoch != epoch:
            return Denied(provider, STALE_EPOCH)
        if current.holder != holder:
            return Denied(provider, HELD, current.expires_at - now)
        return self._extend(current, now)

    def release(self, provider: str, holder: str, epoch: Epoch, now: float) -> bool:
        """End the lease if ``holder`` holds it with ``epoch``. ``False`` (and no change) only when a live lease
        with another epoch or holder exists; releasing a lease that is already gone succeeds."""
        current = self.live(provider, now)
        if current is None:
            return True
        if current.epoch != epoch or current.holder != holder:
            return False
        del self._leases[provider]
        return True

    def _extend(self, lease: Lease, now: float) -> Granted:
        renewed = attrs.evolve(lease, expires_at=now + self.ttl)
        self._leases[lease.provider] = renewed
        return Granted(renewed, self.ttl)
