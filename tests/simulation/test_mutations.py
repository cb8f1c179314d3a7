"""Each invariant can fail: a seeded bug (monkeypatched in for the test only) makes the simulation report it.

Each test searches a few fixed seeds (deterministic: the same seeds fail the same way on every run) and asserts the
matching invariant is reported; without the bug the same seeds are clean (``test_campaign`` covers them).
"""

from __future__ import annotations

import contextlib

import pytest
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.domain.model import Epoch
from provisionerd.testing.simulation import run_seed
from provisionerd.testing.simulation.driver import GateDriver
from provisionerd.testing.simulation.faults import Fault, FaultPlan
from provisionerd.testing.simulation.runner import run_world
from provisionerd.testing.simulation.world import World


def first_seed_reporting(invariant: str, seeds=range(12), **overrides):
    """The first of ``seeds`` whose run reports ``invariant`` (with all it reported), or fail."""
    for seed in seeds:
        result = run_seed(seed, **overrides)
        found = {v.invariant for v in result.violations}
        if invariant in found:
            return seed, found, result
    pytest.fail(f"no seed in {seeds} reported {invariant}")


@pytest.mark.sweep
def test_a_daemon_that_ignores_its_lease_is_caught(monkeypatch):
    # The bug: the keeper trusts any epoch it ever held (no local deadline), and the controller does not check
    # epochs either, so a daemon cut off from renewals keeps committing and calling.
    monkeypatch.setattr(LeaseKeeper, "valid", lambda self, now=None: self.epoch is not None)
    monkeypatch.setattr(LeaseKeeper, "current", lambda self, now=None: self.epoch)

    @contextlib.contextmanager
    def guard(self, epoch):
        with trio.CancelScope() as scope:
            yield scope

    monkeypatch.setattr(LeaseKeeper, "guard", guard)
    monkeypatch.setattr("refcontroller.commits.epoch_rejection", lambda *a, **k: None)
    _, found, _ = first_seed_reporting(
        "mutation_without_lease",
        workload="gate",
        slots=("a",),
        fault_kinds=("partition", "quorum_loss", "failover"),
        max_faults=8,
    )
    assert "gate_decision" in found  # the gate's own log shows admissions past the deadline too


def test_a_gate_that_does_not_wait_for_the_ack_is_caught(monkeypatch):
    # The bug: the gate "commits" the intent without sending it (as if the ack had come).
    from provisionerd.controller.ops import ControllerOps

    real_commit = ControllerOps.commit
    fake_index = iter(range(10_000_000, 20_000_000))

    async def commit(self, fact):
        if type(fact).__name__ in ("RequestIntent", "ReturnIntent"):
            return next(fake_index)
        return await real_commit(self, fact)

    monkeypatch.setattr(ControllerOps, "commit", commit)
    seed, found, _ = first_seed_reporting("mutation_without_intent", workload="gate", max_faults=0)
    assert "unexplained_machine" in found  # the machines it made have no intent on the controller


def test_a_controller_that_accepts_stale_epochs_is_caught(monkeypatch):
    # A stale commit needs a daemon that commits across a failover or partition at the wrong instant: a few seeds
    # in a hundred (here: 15 and 20, since each daemon start draws its Join.instance from its RNG).
    monkeypatch.setattr("refcontroller.commits.epoch_rejection", lambda *a, **k: None)
    first_seed_reporting(
        "stale_fact_accepted", seeds=range(3, 30), workload="gate", fault_kinds=("failover", "partition"), max_faults=8
    )


def test_retrying_an_unknown_outcome_without_looking_is_caught(monkeypatch):
    # The bug: after a timeout or crash, retry requestMachines at once on a cloud without client tokens.
    monkeypatch.setattr(GateDriver, "skip_listing", True)
    first_seed_reporting(
        "op_created_twice", workload="gate", idempotent=False, fault_kinds=("provider_fault",), max_faults=8
    )


def test_a_controller_that_grants_a_held_lease_is_caught(monkeypatch):
    # The bug: the lease table grants a new epoch to whoever asks, whoever holds it.
    from refcontroller.leases import Granted, Lease, LeaseTable

    def acquire(self, provider, holder, now, *, quorum_fresh, previous_holder):
        current = self.live(provider, now)
        if current is not None and current.holder == holder:
            return self._extend(current, now)
        self.seq += 1
        lease = Lease(provider, holder, Epoch(self.term, self.seq), now + self.ttl)
        self._leases[provider] = lease
        return Granted(lease, self.ttl)

    monkeypatch.setattr(LeaseTable, "acquire", acquire)
    first_seed_reporting("two_lease_holders", workload="gate", slots=("a", "b"), max_faults=0)


def test_a_failover_that_reuses_an_old_term_is_caught(monkeypatch):
    # The bug: after a failover the new primary numbers its grants from an older term.
    from refcontroller.cluster import Cluster
    from refcontroller.leases import LeaseTable

    def fail_over(self, now, target=None):
        primary = self.replicas.fail_over(now, target)
        self.leases = LeaseTable(max(1, self.term - 2), now, self.ttl, self.check_interval)
        return primary

    monkeypatch.setattr(Cluster, "fail_over", fail_over)
    plan = FaultPlan((Fault(40.0, "failover", value=1.0), Fault(90.0, "failover", value=2.0)))
    world = World(4, plan=plan, workload="gate", slots=("a",))
    found = {v.invariant for v in run_world(world).violations}
    assert "epoch_regressed" in found


def test_a_daemon_task_that_dies_is_caught(monkeypatch):
    from provisionerd.controller.view import ControllerView

    def apply_hosts(self, hosts):
        raise RuntimeError("seeded bug in the view")

    monkeypatch.setattr(ControllerView, "apply_hosts", apply_hosts)
    first_seed_reporting("daemon_crashed", workload="gate", max_faults=0)


def test_a_controller_internal_error_is_caught(monkeypatch):
    import refcontroller.session as session_module

    real = session_module.provisioner_reply

    def reply(cluster, replica, identity, providers, msg, now):
        if type(msg).__name__ == "FactCommit" and now > 100:
            raise KeyError("seeded bug in the controller")
        return real(cluster, replica, identity, providers, msg, now)

    monkeypatch.setattr(session_module, "provisioner_reply", reply)
    first_seed_reporting("controller_error", workload="gate", max_faults=0)


def test_a_lifecycle_that_never_requests_is_caught(monkeypatch):
    from provisionerd.execution import loop as reconcile_loop
    from provisionerd.planner.plan import Plan

    monkeypatch.setattr(reconcile_loop, "plan", lambda state, *a, **k: Plan(actions=(), state=state))
    _, found, result = first_seed_reporting("no_convergence", workload="lifecycle", max_faults=0)
    assert found == {"no_convergence"}


def test_a_busy_loop_is_reported_as_stuck():
    class Spin:
        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            task_status.started()
            while True:
                await trio.lowlevel.checkpoint()

    world = World(1, workload="gate", max_faults=0, workload_factory=lambda world, node, rng: Spin())
    result = run_world(world, wall_budget=1.0)
    assert [v.invariant for v in result.violations] == ["stuck"]
