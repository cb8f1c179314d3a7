"""Two confirmations of the etcd primary claim may overlap (each runs in a worker thread): one that finds the claim
cleared by the other while it checks steps down like it, never fails (an AttributeError killed a woken primary in
the SIGSTOP test: it never logged 'stepping down')."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rc_factories import FakeEtcd

from refcontroller.election_etcd import EtcdElection
from refcontroller.store_etcd_client import EtcdError


class Leases(FakeEtcd):
    """FakeEtcd with leases that expired while the process was stopped; ``meanwhile`` runs inside a keepalive."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], None] = lambda: None
        self.alive = True

    def grant(self, ttl: int) -> int:
        return 7

    def keepalive(self, lease: int) -> int:
        self.meanwhile()
        return 2 if self.alive else 0


def test_a_confirmation_overlapping_another_that_cleared_the_claim_steps_down_too() -> None:
    client = Leases()
    election = EtcdElection(client, "a", "a:7000")  # type: ignore[arg-type]
    assert election.campaign() is not None and election.confirm()
    client.alive = False
    client.meanwhile = lambda: setattr(election, "claim", None)  # the other thread's confirm, at that moment
    assert election.confirm() is False
    assert election.claim is None
    with pytest.raises(EtcdError, match="no claim"):
        election.fence()
