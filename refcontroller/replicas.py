"""The replica set: N replicas in one process, one primary, a durable HA term, and the quorum switch.

This models the parts of the real controller's HA that the lease design (seed Q3) depends on, and nothing more:

- **Term.** A fencing token: it grows by one on every election (each failover, and each start of the process,
  which is an election too) and is saved durably *before* the new primary acts. Lease epochs are
  ``(term, seq)``, so a term that never repeats makes every epoch unique and ordered.
- **Primary and promotion time.** ``promoted_at`` (the controller's monotonic clock) starts the grace period in
  ``leases.py``: a new primary cannot know when the previous one last renewed a lease on its clock.
- **Quorum freshness.** The real controller grants and renews only while a majority of replicas acknowledged a
  heartbeat of the current term within ``T_check``. All our replicas live in one process and so always
  acknowledge; the admin switch ``set_quorum(False)`` simulates the primary having *observed* that no majority
  acknowledged within ``T_check`` (the observation delay itself is part of the grace, not simulated here).
  Failing over does not change the switch: the simulated partition persists until it is healed.

Pure and synchronous: callers pass ``now`` and a ``save_term`` function (the store's).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.define(eq=False)
class ReplicaSet:
    """Which replica is primary, in which term, since when; and whether its quorum is fresh."""

    count: int
    term: int
    primary: int
    promoted_at: float
    save_term: Callable[[int], None] = attrs.field(repr=False)
    quorum_fresh: bool = True
    addresses: list[str] = attrs.field(factory=list)

    @classmethod
    def elect(cls, count: int, stored_term: int, save_term: Callable[[int], None], now: float) -> ReplicaSet:
        """Start a replica set after a (re)start: replica 0 wins the election in term ``stored_term + 1``.

        The new term is saved before the set is returned.
        """
        if count < 1:
            raise ValueError(f"a replica set needs at least one replica, not {count!r}")
        term = stored_term + 1
        save_term(term)
        return cls(count=count, term=term, primary=0, promoted_at=now, save_term=save_term)

    def is_primary(self, replica: int) -> bool:
        return replica == self.primary

    def address_of(self, replica: int) -> str:
        return self.addresses[replica] if replica < len(self.addresses) else ""

    @property
    def primary_address(self) -> str:
        return self.address_of(self.primary)

    def fail_over(self, now: float, target: int | None = None) -> int:
        """Promote ``target`` (default: the next replica, wrapping around) in a new term; return its index.

        The term is saved durably before anything else changes. Raises ``ValueError`` for a target that is out of
        range, and for the current primary when there are other replicas (a failover must change the primary;
        with a single replica, failing over to itself is a re-election: a new term and a new grace period).
        """
        if target is None or target < 0:
            target = (self.primary + 1) % self.count
        if not 0 <= target < self.count:
            raise ValueError(f"no replica {target!r}: there are {self.count}")
        if target == self.primary and self.count > 1:
            raise ValueError(f"replica {target} is already the primary")
        new_term = self.term + 1
        self.save_term(new_term)
        self.term = new_term
        self.primary = target
        self.promoted_at = now
        return target

    def set_quorum(self, fresh: bool) -> None:
        self.quorum_fresh = fresh
