"""The lease table on an injected clock: grant, renew, expiry, quorum, grace after promotion."""

from __future__ import annotations

import pytest

from provisionerd.domain.model import Epoch
from refcontroller.leases import Denied, Granted, LeaseTable

TTL, CHECK = 30.0, 5.0


def table(term: int = 1, promoted_at: float = 0.0) -> LeaseTable:
    return LeaseTable(term=term, promoted_at=promoted_at, ttl=TTL, check_interval=CHECK)


def granted(result: Granted | Denied) -> Granted:
    assert isinstance(result, Granted), result
    return result


def denied(result: Granted | Denied, reason: str) -> Denied:
    assert isinstance(result, Denied), result
    assert result.reason == reason
    return result


def test_grant_after_grace_carries_term_and_increasing_seq() -> None:
    t = table(term=4)
    a = granted(t.acquire("aws", "d1", 40.0, quorum_fresh=True, previous_holder=None))
    b = granted(t.acquire("gcp", "d2", 41.0, quorum_fresh=True, previous_holder=None))
    assert (a.lease.epoch, b.lease.epoch) == (Epoch(4, 1), Epoch(4, 2))
    assert a.ttl_ms == 30_000 and a.lease.expires_at == 70.0


def test_renew_extends_with_same_epoch_and_lapses_after_ttl_without_renewal() -> None:
    t = table()
    lease = granted(t.acquire("aws", "d1", 100.0, quorum_fresh=True, previous_holder=None)).lease
    renewed = granted(t.renew("aws", "d1", lease.epoch, 120.0, quorum_fresh=True)).lease
    assert renewed.epoch == lease.epoch and renewed.expires_at == 150.0
    assert t.live("aws", 149.999) is not None
    assert t.live("aws", 150.0) is None  # expired exactly at renew + ttl on the controller's clock
    denied(t.renew("aws", "d1", lease.epoch, 150.0, quorum_fresh=True), "no_lease")
    # Another holder may now take it, with a new epoch.
    other = granted(t.acquire("aws", "d2", 150.0, quorum_fresh=True, previous_holder="d1")).lease
    assert other.epoch > lease.epoch and other.holder == "d2"


def test_held_lease_is_denied_to_another_holder_with_time_left() -> None:
    t = table()
    granted(t.acquire("aws", "d1", 100.0, quorum_fresh=True, previous_holder=None))
    d = denied(t.acquire("aws", "d2", 110.0, quorum_fresh=True, previous_holder=None), "held")
    assert d.retry_after == pytest.approx(20.0) and d.retry_after_ms == 20_000


def test_acquire_by_current_holder_is_idempotent() -> None:
    t = table()
    first = granted(t.acquire("aws", "d1", 100.0, quorum_fresh=True, previous_holder=None)).lease
    again = granted(t.acquire("aws", "d1", 110.0, quorum_fresh=True, previous_holder=None)).lease
    assert again.epoch == first.epoch and again.expires_at == 140.0


def test_no_grant_and_no_renew_without_quorum() -> None:
    t = table()
    denied(t.acquire("aws", "d1", 100.0, quorum_fresh=False, previous_holder=None), "no_quorum")
    lease = granted(t.acquire("aws", "d1", 100.0, quorum_fresh=True, previous_holder=None)).lease
    denied(t.renew("aws", "d1", lease.epoch, 101.0, quorum_fresh=False), "no_quorum")
    assert t.seq == 1  # a denied acquire consumed no epoch


def test_grace_after_promotion_denies_a_different_holder_until_ttl_plus_check() -> None:
    t = table(term=2, promoted_at=1000.0)
    d = denied(t.acquire("aws", "d2", 1000.0, quorum_fresh=True, previous_holder="d1"), "grace")
    assert d.retry_after == pytest.approx(35.0)
    denied(t.acquire("aws", "d2", 1034.999, quorum_fresh=True, previous_holder="d1"), "grace")
    assert granted(t.acquire("aws", "d2", 1035.0, quorum_fresh=True, previous_holder="d1")).lease.epoch == Epoch(2, 1)


def test_grace_applies_to_a_provider_without_facts() -> None:
    t = table(term=2, promoted_at=0.0)
    denied(t.acquire("new", "d1", 10.0, quorum_fresh=True, previous_holder=None), "grace")


def test_previous_holder_is_regranted_at_once_with_a_new_term_epoch() -> None:
    t = table(term=3, promoted_at=500.0)
    lease = granted(t.acquire("aws", "d1", 500.0, quorum_fresh=True, previous_holder="d1")).lease
    assert lease.epoch == Epoch(3, 1)
    assert lease.epoch > Epoch(2, 99)


def test_release_needs_holder_and_current_epoch() -> None:
    t = table()
    lease = granted(t.acquire("aws", "d1", 100.0, quorum_fresh=True, previous_holder=None)).lease
    assert not t.release("aws", "d2", lease.epoch, 101.0)
    assert not t.release("aws", "d1", Epoch(1, 99), 101.0)
    assert t.live("aws", 101.0) == lease
    assert t.release("aws", "d1", lease.epoch, 101.0)
    assert t.live("aws", 101.0) is None
    assert t.release("aws", "d1", lease.epoch, 101.0)  # nothing left to release: fine
    assert granted(t.acquire("aws", "d2", 101.0, quorum_fresh=True, previous_holder="d1")).lease.epoch == Epoch(1, 2)


def test_renew_with_another_epoch_or_by_another_holder_is_denied() -> None:
    t = table()
    lease = granted(t.acquire("aws", "d1", 100.0, quorum_fresh=True, previous_holder=None)).lease
    denied(t.renew("aws", "d1", Epoch(1, 7), 101.0, quorum_fresh=True), "stale_epoch")
    denied(t.renew("aws", "d2", lease.epoch, 101.0, quorum_fresh=True), "held")
    assert t.live("aws", 101.0) == lease


def test_bad_durations_are_refused() -> None:
    with pytest.raises(ValueError):
        LeaseTable(term=1, promoted_at=0.0, ttl=0.0, check_interval=1.0)
