"""Which messages each role may send. The controller enforces it on every frame a client sends.

A client's role comes from its verified certificate (``tls.peer_role``), never from its ``Join``: a ``Join`` whose
``role`` differs from the certificate's is refused as ``not_allowed`` too. A frame outside the allowlist gets
``ErrorMsg{code: not_allowed}`` and the connection is closed.

``ALLOWED[Role.CONTROLLER]`` lists what the controller sends, so a client may check incoming frames the same way.
"""

from __future__ import annotations

from provisionerd.domain.errors import OpcodeNotAllowed
from provisionerd.domain.model import Role
from provisionerd.wire.codec import opcode
from provisionerd.wire.messages import (
    Ack,
    AdminFailover,
    AdminQuorum,
    AdminReply,
    AdminSetDemand,
    AdminStatus,
    DemandPage,
    ErrorMsg,
    FactAck,
    FactCommit,
    Heartbeat,
    HeartbeatAck,
    HistoryPage,
    HistoryQuery,
    HostStatePush,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseDenied,
    LeaseFreed,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Rejected,
    ResyncPage,
    ResyncRequest,
    WorkerStatus,
)

_SESSION = frozenset({Join, Heartbeat})

ALLOWED: dict[Role, frozenset[type]] = {
    # HistoryQuery: a provisioner reads only the providers its Join declared (the controller checks each query)
    Role.PROVISIONER: _SESSION | {LeaseAcquire, LeaseRenew, LeaseRelease, FactCommit, ResyncRequest, HistoryQuery},
    Role.WORKER: _SESSION | {WorkerStatus},
    Role.ADMIN: _SESSION | {AdminSetDemand, AdminFailover, AdminQuorum, AdminStatus, HistoryQuery},
    Role.CONTROLLER: frozenset(
        {
            JoinReply,
            HeartbeatAck,
            ErrorMsg,
            Rejected,
            Ack,
            LeaseGrant,
            LeaseDenied,
            DemandPage,
            FactAck,
            ResyncPage,
            HostStatePush,
            AdminReply,
            LeaseFreed,
            HistoryPage,
        }
    ),
}


def is_allowed(role: Role, msg: object) -> bool:
    return type(msg) in ALLOWED.get(role, frozenset())


def check_allowed(role: Role, msg: object) -> None:
    """Raise ``OpcodeNotAllowed(role, opcode)`` unless ``role`` may send ``msg``."""
    if not is_allowed(role, msg):
        raise OpcodeNotAllowed(role.value, opcode(msg))
