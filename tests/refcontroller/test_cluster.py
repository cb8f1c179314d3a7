"""The composed core on an injected clock: facts and epochs, failover, tokens, demand, durability."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from rc_factories import instance, intent, item, sha

from provisionerd.domain.model import CommittedFact, DemandSnapshot, Epoch, HostStatus, Lost
from refcontroller.cluster import Cluster
from refcontroller.commits import Rejection
from refcontroller.leases import Denied, Granted
from refcontroller.store import FactStore

GRACE_END = 35.0  # promoted at 0, ttl 30, check 5 (conftest)


def grant(cluster: Cluster, provider: str, holder: str, now: float, replica: int | None = None) -> Epoch:
    result = cluster.acquire(cluster.replicas.primary if replica is None else replica, provider, holder, now)
    assert isinstance(result, Granted), result
    return result.lease.epoch


def commit(cluster: Cluster, fact, sender: str, now: float) -> CommittedFact | Rejection:
    return cluster.commit(cluster.replicas.primary, fact, sender, now)


def rejected(result: object, reason: str) -> None:
    assert isinstance(result, Rejection), result
    assert result.reason == reason, result


def test_fact_with_current_epoch_is_committed_with_increasing_index(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    a = commit(cluster, intent("aws", epoch, "op-1"), "d1", 36.0)
    b = commit(cluster, instance("aws", epoch, "i-1"), "d1", 37.0)
    assert isinstance(a, CommittedFact) and isinstance(b, CommittedFact)
    assert 0 < a.index < b.index
    assert cluster.store.latest("aws").epoch == epoch


def test_stale_epoch_fact_is_rejected_and_nothing_is_written(cluster: Cluster) -> None:
    old = grant(cluster, "aws", "d1", GRACE_END)
    assert cluster.release(0, "aws", "d1", old, 36.0) is None
    new = grant(cluster, "aws", "d2", 36.0)
    assert new > old
    rejected(commit(cluster, intent("aws", old), "d1", 37.0), "stale_epoch")
    rejected(commit(cluster, intent("aws", old), "d2", 37.0), "stale_epoch")
    assert cluster.store.count() == 0


def test_older_epoch_of_the_same_holder_in_the_same_term_is_stale(cluster: Cluster) -> None:
    first = grant(cluster, "aws", "d1", GRACE_END)
    second = grant(cluster, "aws", "d1", GRACE_END + 30.0)  # the first lapsed at 65; a new grant, a new seq
    assert second == Epoch(1, 2)
    rejected(commit(cluster, intent("aws", first), "d1", 66.0), "stale_epoch")


def test_fact_without_a_lease_or_from_another_identity_is_rejected_no_lease(cluster: Cluster) -> None:
    rejected(commit(cluster, intent("aws", Epoch(1, 1)), "d1", 36.0), "no_lease")
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    rejected(commit(cluster, intent("aws", epoch), "intruder", 36.0), "no_lease")


def test_fact_after_lease_expiry_is_rejected(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", 100.0)
    rejected(commit(cluster, intent("aws", epoch), "d1", 130.0), "no_lease")


def test_no_quorum_blocks_grants_and_commits_until_restored(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    cluster.set_quorum(False)
    assert isinstance(cluster.acquire(0, "gcp", "d1", 40.0), Denied)
    assert cluster.renew(0, "aws", "d1", epoch, 40.0).reason == "no_quorum"
    rejected(commit(cluster, intent("aws", epoch), "d1", 40.0), "no_quorum")
    cluster.set_quorum(True)
    assert isinstance(commit(cluster, intent("aws", epoch), "d1", 41.0), CommittedFact)


def test_standby_answers_not_primary(cluster: Cluster) -> None:
    assert cluster.acquire(1, "aws", "d1", 40.0).reason == "not_primary"
    rejected(cluster.commit(2, intent("aws", Epoch(1, 1)), "d1", 40.0), "not_primary")


def test_malformed_fact_is_invalid(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    bad = attrs.evolve(intent("aws", epoch), token_hashes=("not-a-hash",))
    rejected(commit(cluster, bad, "d1", 36.0), "invalid")
    short = attrs.evolve(intent("aws", epoch), count=2)
    rejected(commit(cluster, short, "d1", 36.0), "invalid")
    rejected(commit(cluster, Lost("aws", epoch, "", "m-1", "gone"), "d1", 36.0), "invalid")


def test_retried_commit_returns_the_existing_index(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    first = commit(cluster, intent("aws", epoch), "d1", 36.0)
    again = commit(cluster, intent("aws", epoch), "d1", 37.0)
    assert first == again and cluster.store.count() == 1


def test_failover_term_grace_and_immediate_regrant_to_previous_holder(cluster: Cluster) -> None:
    e1 = grant(cluster, "aws", "d1", GRACE_END)
    assert isinstance(commit(cluster, intent("aws", e1), "d1", 36.0), CommittedFact)
    assert cluster.fail_over(now=50.0) == 1
    assert cluster.term == 2 and cluster.store.load_term() == 2
    assert cluster.leases.live("aws", 50.0) is None  # the new primary's table starts empty
    # d2 must wait out TTL + check interval; d1 wrote the latest fact and gets it back at once.
    denied = cluster.acquire(1, "aws", "d2", 50.0)
    assert isinstance(denied, Denied) and denied.reason == "grace" and denied.retry_after == pytest.approx(35.0)
    e2 = grant(cluster, "aws", "d1", 50.0, replica=1)
    assert e2 == Epoch(2, 1) and e2 > e1
    # The old epoch is fenced off; the new one works.
    rejected(cluster.commit(1, instance("aws", e1, "i-1"), "d1", 51.0), "stale_epoch")
    assert isinstance(cluster.commit(1, instance("aws", e2, "i-1"), "d1", 51.0), CommittedFact)
    # The old primary is a standby now.
    assert cluster.acquire(0, "aws", "d1", 51.0).reason == "not_primary"


def test_grace_regrants_to_the_last_grantee_even_when_it_wrote_no_fact_yet(cluster: Cluster) -> None:
    """Simulation seed 7001: d1 wrote the latest fact, then its lease lapsed and d2 was granted (and believed in it)
    but lost the primary before committing anything. The new primary must not hand the lease back to d1 at once."""
    e1 = grant(cluster, "aws", "d1", GRACE_END)
    assert isinstance(commit(cluster, intent("aws", e1), "d1", 36.0), CommittedFact)
    e2 = grant(cluster, "aws", "d2", 70.0)  # d1's lease expired at 65
    assert e2 > e1 and cluster.store.latest("aws").holder == "d1"
    cluster.fail_over(now=80.0)  # d2 still trusts e2 (until about 100)
    denied = cluster.acquire(1, "aws", "d1", 80.0)
    assert isinstance(denied, Denied) and denied.reason == "grace"
    assert grant(cluster, "aws", "d2", 80.0, replica=1) == Epoch(2, 1)
    # The grantee is durable: a store reopened elsewhere answers the same.
    assert cluster.store.last_grantee("aws") == "d2"


def test_a_worker_that_joined_on_its_intent_gets_its_machine_id_from_the_later_instance_fact(cluster: Cluster) -> None:
    """A fast machine joins between the intent and the instance fact: the host is identified when the fact lands,
    and the change is handed on (the server pushes it to the provisioners)."""
    pushed: list = []
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch, refs=("i-1", "i-2")), "d1", 36.0)
    early = cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9)
    assert early.machine_id == "" and early.hostname == ""
    assert isinstance(commit(cluster, instance("aws", epoch, "i-1"), "d1", 37.0), CommittedFact)
    host = cluster.hosts.get("i-1")
    assert (host.machine_id, host.hostname, host.status, host.since) == ("m-i-1", "host-i-1", HostStatus.JOINED, 1e9)
    pushed.extend(cluster.take_host_changes())  # what the session would push
    assert pushed == [host]
    commit(cluster, instance("aws", epoch, "i-2"), "d1", 38.0)  # no host for i-2 yet: nothing to identify
    pushed.extend(cluster.take_host_changes())  # what the session would push
    assert pushed == [host] and cluster.hosts.get("i-2") is None


def test_failover_targets(cluster: Cluster) -> None:
    assert cluster.fail_over(1.0, target=2) == 2
    assert cluster.fail_over(2.0) == 0  # next wraps around
    with pytest.raises(ValueError):
        cluster.fail_over(3.0, target=0)
    with pytest.raises(ValueError):
        cluster.fail_over(3.0, target=7)
    assert cluster.term == 3


def test_worker_token_is_single_use_and_bound_to_its_instance(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch, refs=("i-1", "i-2")), "d1", 36.0)
    # Joined from the intent's hashes, before any instance fact exists.
    host = cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9)
    assert host.status is HostStatus.JOINED and host.provider == "aws" and host.since == 1e9
    assert cluster.credential_delivered("i-1", 1e9)  # the worker sent a frame after its reply
    rejected(cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9 + 1), "token_invalid")  # used
    rejected(cluster.admit_worker(0, "i-1", "tok-i-2", wall=1e9 + 1), "token_invalid")  # another instance's
    rejected(cluster.admit_worker(0, "i-2", "tok-i-1", wall=1e9 + 1), "token_invalid")
    rejected(cluster.admit_worker(0, "i-9", "whatever", wall=1e9 + 1), "token_invalid")
    # The refusal of a token for another instance did not consume it.
    assert cluster.admit_worker(0, "i-2", "tok-i-2", wall=1e9 + 2).instance_ref == "i-2"


def test_a_spent_token_whose_credential_never_arrived_is_exchanged_again_once_delivered_never(cluster: Cluster) -> None:
    """Issue 31: the controller died (or the link broke) between spending a worker's token and its reply, so the
    worker never got its credential and every later join was refused: a healthy machine returned. While the
    credential was never delivered, no session of the instance is live and nothing revoked it, the token buys a
    new credential (the old one stops admitting); once delivered, or with a live session, it is spent for good."""
    from refcontroller.credentials import new_credential

    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch, refs=("i-1", "i-2")), "d1", 36.0)
    first, second = new_credential(), new_credential()
    assert cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9, credential=first).instance_ref == "i-1"
    rejected(cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9 + 1, credential=second, live=True), "token_invalid")
    assert cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9 + 2, credential=second).instance_ref == "i-1"
    rejected(cluster.admit_worker(0, "i-1", first, wall=1e9 + 3), "credential_stale")  # replaced
    rejected(cluster.admit_worker(0, "i-2", "tok-i-1", wall=1e9 + 3), "token_invalid")  # never another instance's
    assert cluster.admit_worker(0, "i-1", second, wall=1e9 + 4).instance_ref == "i-1"
    assert cluster.credential_delivered("i-1", 1e9 + 4)
    rejected(cluster.admit_worker(0, "i-1", "tok-i-1", wall=1e9 + 5, credential=new_credential()), "token_invalid")
    assert cluster.admit_worker(0, "i-1", second, wall=1e9 + 6).instance_ref == "i-1"


def test_worker_admitted_from_instance_fact_gets_machine_details(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch, refs=("i-1",)), "d1", 36.0)
    commit(cluster, instance("aws", epoch, "i-1"), "d1", 37.0)
    host = cluster.admit_worker(0, "i-1", "tok-i-1", wall=5.0)
    assert (host.machine_id, host.hostname) == ("m-i-1", "host-i-1")


def test_rejection_detail_never_contains_the_token(cluster: Cluster) -> None:
    secret = "s3cret-token-value"
    result = cluster.admit_worker(0, "i-1", secret, wall=0.0)
    assert isinstance(result, Rejection) and secret not in result.detail and sha(secret) not in result.detail


def test_host_states_follow_worker_reports(cluster: Cluster) -> None:
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch), "d1", 36.0)
    cluster.admit_worker(0, "i-1", "tok-i-1", wall=10.0)
    assert cluster.worker_status("i-1", HostStatus.IDLE, 11.0).since == 11.0
    assert cluster.worker_status("i-1", HostStatus.IDLE, 12.0) is None  # no change
    assert cluster.worker_status("i-1", HostStatus.BUSY, 13.0).status is HostStatus.BUSY
    assert cluster.worker_lost("i-1", 20.0).status is HostStatus.LOST
    assert cluster.worker_status("i-1", HostStatus.IDLE, 21.0) is None  # lost stays lost
    with pytest.raises(ValueError):
        cluster.worker_status("i-1", HostStatus.LOST, 22.0)


def test_demand_seq_grows_on_change_only_and_bad_demand_is_refused(cluster: Cluster) -> None:
    first = cluster.set_demand([item("a", 2)])
    assert first == DemandSnapshot(seq=1, items=(item("a", 2),))
    assert cluster.set_demand([item("a", 2)]) is None
    assert cluster.set_demand([]).seq == 2
    with pytest.raises(ValueError, match="appears twice"):
        cluster.set_demand([item("a"), item("a")])
    with pytest.raises(ValueError, match="count"):
        cluster.set_demand([item("b", -1)])
    assert cluster.demand.seq == 2


def test_state_survives_reopen_and_restart_is_a_new_term(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    store = FactStore.open(path)
    cluster = Cluster.open(store, replica_count=3, ttl=30.0, check_interval=5.0, now=0.0)
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    committed = commit(cluster, intent("aws", epoch, refs=("i-1", "i-2")), "d1", 36.0)
    cluster.admit_worker(0, "i-1", "tok-i-1", wall=1.0)
    cluster.credential_delivered("i-1", 1.0)  # its worker has it: the token is spent for good
    cluster.set_demand([item("a", 3)])
    cluster.fail_over(40.0)
    store.close()

    store = FactStore.open(path)
    again = Cluster.open(store, replica_count=3, ttl=30.0, check_interval=5.0, now=1000.0)
    assert again.term == 3 and again.replicas.primary == 0  # term 1, failover to 2, restart elects in 3
    assert list(store.all_facts()) == [committed]
    assert again.demand == DemandSnapshot(seq=1, items=(item("a", 3),))
    rejected(again.admit_worker(0, "i-1", "tok-i-1", wall=2.0), "token_invalid")  # still used
    assert again.admit_worker(0, "i-2", "tok-i-2", wall=2.0).instance_ref == "i-2"
    # After the restart the previous holder is re-granted at once, anyone else waits.
    assert again.acquire(0, "aws", "d2", 1000.0).reason == "grace"
    assert grant(again, "aws", "d1", 1000.0) == Epoch(3, 1)
    store.close()


def test_resync_plan_pages_facts_of_the_requested_providers(cluster: Cluster) -> None:
    e_aws = grant(cluster, "aws", "d1", GRACE_END)
    e_gcp = grant(cluster, "gcp", "d1", GRACE_END)
    for i in range(5):
        commit(cluster, intent("aws", e_aws, f"op-a{i}", refs=(f"a{i}",)), "d1", 36.0)
        commit(cluster, intent("gcp", e_gcp, f"op-g{i}", refs=(f"g{i}",)), "d1", 36.0)
    plan = cluster.resync_plan(["aws"])
    facts = [f for page in range(len(plan.fact_ranges)) for f in cluster.resync_facts(plan, page)]
    assert [f.fact.op_id for f in facts] == [f"op-a{i}" for i in range(5)]
    assert cluster.resync_plan(["none"]).fact_ranges == ()


def test_status_document(cluster: Cluster) -> None:
    cluster.replicas.addresses = ["a:1", "b:2", "c:3"]
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch), "d1", 36.0)
    cluster.set_demand([item("a", 1)])
    status = cluster.status(40.0)
    assert (
        status["primary"] == 0
        and status["term"] == 1
        and status["replicas"][1]
        == {
            "index": 1,
            "address": "b:2",
            "primary": False,
        }
    )
    assert status["leases"] == [{"provider": "aws", "holder": "d1", "epoch": "1.1", "expires_in_s": 25.0}]
    assert status["facts"] == {"count": 1, "live": 1, "last_index": 1} and status["demand"]["seq"] == 1
    assert status["latest_epochs"] == {"aws": "1.1"}
