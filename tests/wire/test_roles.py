"""The per-role allowlist: exactly the documented messages, and a refusal for everything else."""

from __future__ import annotations

import pytest

from provisionerd.domain.errors import OpcodeNotAllowed
from provisionerd.domain.model import Epoch, Role
from provisionerd.wire import messages as m
from provisionerd.wire.roles import ALLOWED, check_allowed, is_allowed

# The spec (docs/protocol.md, "Role allowlist"), written out independently of roles.py.
SPEC = {
    Role.PROVISIONER: {
        m.Join,
        m.Heartbeat,
        m.LeaseAcquire,
        m.LeaseRenew,
        m.LeaseRelease,
        m.FactCommit,
        m.ResyncRequest,
        m.HistoryQuery,
    },
    Role.WORKER: {m.Join, m.Heartbeat, m.WorkerStatus},
    Role.ADMIN: {m.Join, m.Heartbeat, m.AdminSetDemand, m.AdminFailover, m.AdminQuorum, m.AdminStatus, m.HistoryQuery},
    Role.CONTROLLER: {
        m.JoinReply,
        m.HeartbeatAck,
        m.ErrorMsg,
        m.Rejected,
        m.Ack,
        m.LeaseGrant,
        m.LeaseDenied,
        m.DemandPage,
        m.FactAck,
        m.ResyncPage,
        m.HostStatePush,
        m.AdminReply,
        m.LeaseFreed,
        m.HistoryPage,
    },
}


def test_allowlist_matches_the_spec_and_covers_every_message():
    assert {role: set(kinds) for role, kinds in ALLOWED.items()} == SPEC
    assert set().union(*SPEC.values()) == set(m.MESSAGE_TYPES)


def test_a_worker_sending_a_provisioner_opcode_is_refused():
    with pytest.raises(OpcodeNotAllowed) as info:
        check_allowed(Role.WORKER, m.LeaseAcquire("aws"))
    assert (info.value.role, info.value.opcode) == ("worker", "leaseAcquire")


@pytest.mark.parametrize(
    "role, msg",
    [
        (Role.ADMIN, m.FactCommit(fact=None)),  # type: ignore[arg-type]
        (Role.ADMIN, m.LeaseRenew("aws", Epoch(1, 1))),
        (Role.PROVISIONER, m.AdminFailover()),
        (Role.PROVISIONER, m.WorkerStatus(status=None)),  # type: ignore[arg-type]
        (Role.WORKER, m.AdminSetDemand()),
        (Role.PROVISIONER, m.LeaseGrant("aws", Epoch(1, 1), 1000)),  # a client may not speak for the controller
    ],
)
def test_cross_role_opcodes_are_refused(role, msg):
    assert not is_allowed(role, msg)
    with pytest.raises(OpcodeNotAllowed):
        check_allowed(role, msg)


def test_every_role_may_join_and_heartbeat():
    for role in (Role.PROVISIONER, Role.WORKER, Role.ADMIN):
        check_allowed(role, m.Join(role, "x"))
        check_allowed(role, m.Heartbeat(1))
