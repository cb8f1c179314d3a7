"""The wire messages: one frozen class per body kind of ``Frame`` in ``protocol/provisioner.capnp``.

Field names are the schema's in snake_case (``protocolVersion`` -> ``protocol_version``); the codec relies on that
rule, so a field added here must be added to the schema under the same name. Sequence fields accept any iterable
and are stored as tuples, so a message built from a list equals the one decoded from the wire.

The string codes (``ErrorMsg.code``, ``Rejected.reason``, ``LeaseDenied.reason``) are enums in the schema; here they
are checked against ``ERROR_CODES``, ``REJECT_REASONS`` and ``DENY_REASONS`` when the message is built, so a typo
fails at its source rather than at encode time on the other side of the program.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from provisionerd.domain.model import (
    PROTOCOL_VERSION,
    CommittedFact,
    DemandItem,
    Epoch,
    Fact,
    HostState,
    HostStatus,
    LicenseUse,
    Role,
)

#: ``ErrorMsg.code`` values. The sender closes the connection after most of them (see docs/protocol.md).
ERROR_CODES = ("version_mismatch", "not_allowed", "bad_frame", "not_joined", "token_invalid", "internal")
#: ``Rejected.reason`` values: a typed refusal of one request; the connection stays up.
REJECT_REASONS = (
    "stale_epoch",
    "no_quorum",
    "not_primary",
    "no_lease",
    "invalid",
    "token_invalid",
    "storage_failure",
)
#: ``LeaseDenied.reason`` values.
DENY_REASONS = ("held", "grace", "no_quorum", "not_primary", "stale_epoch", "no_lease")


def _strs() -> tuple[str, ...]:
    return attrs.field(converter=tuple, default=())


# The sequence fields' converters, one per element type: mypy's attrs plugin cannot solve the type variable of
# ``converter=tuple`` (or of a generic converter), and would refuse every argument.
def _demand_items(items: Iterable[DemandItem]) -> tuple[DemandItem, ...]:
    return tuple(items)


def _license_uses(uses: Iterable[LicenseUse]) -> tuple[LicenseUse, ...]:
    return tuple(uses)


def _committed_facts(items: Iterable[CommittedFact]) -> tuple[CommittedFact, ...]:
    return tuple(items)


def _host_states(items: Iterable[HostState]) -> tuple[HostState, ...]:
    return tuple(items)


def _code(allowed: tuple[str, ...], wire_enum: str) -> str:
    # ``wire_enum`` names the schema enum; the codec maps "stale_epoch" <-> staleEpoch through it.
    return attrs.field(validator=attrs.validators.in_(allowed), metadata={"wire_enum": wire_enum})


# --- session (all roles) ---------------------------------------------------------------------------------------


@attrs.frozen
class Join:
    """client -> ctl, the first frame of every connection. Workers fill ``instance_ref`` and ``token``.

    A provisioner fills ``instance``: random per process start and never reused, so that two live daemons
    configured with the same ``identity`` are two lease holders (``identity`` + ``instance``), not one. An older
    peer's Join decodes with ``instance = ""``.
    """

    role: Role
    identity: str
    protocol_version: int = PROTOCOL_VERSION
    providers: tuple[str, ...] = _strs()
    instance_ref: str = ""
    # The single-use join token is a secret: kept out of repr so it cannot reach a log line by accident.
    token: str = attrs.field(default="", repr=False)
    instance: str = ""
    #: The address-bound join (protocol §4): the provider's machine id a worker without a token claims to be.
    machine_id: str = ""
    #: A worker's capabilities (protocol §4 "Capabilities"): offer attribute name -> the value it found.
    capabilities: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class JoinReply:
    """ctl -> client. A standby answers ``accepted=False, primary=False, redirect="host:port"``.

    An accepted worker reply may carry ``credential``: the instance's own secret for every later join.
    An accepted reply carries the controller's ``incarnation`` (the id of its fact log, made when the log was
    created and never again; ``""`` from an older controller: unknown) and ``last_index`` (the highest fact index
    the log ever committed), so a provisioner can tell a controller that forgot what it acknowledged.
    """

    accepted: bool
    term: int = 0
    primary: bool = False
    redirect: str = ""
    controller_id: str = ""
    protocol_version: int = PROTOCOL_VERSION
    reason: str = ""
    incarnation: str = ""
    last_index: int = 0
    # A worker's own credential, a secret like the token: kept out of repr (protocol §4 "Worker credential").
    credential: str = attrs.field(default="", repr=False)
    #: An accepted address-bound join: the instance the claimed machine was paired with.
    instance_ref: str = ""
    #: The controller knows ``DrainRequested`` facts and ``HostState.draining`` (``False`` from older ones).
    drains: bool = False
    #: The controller answers ``HistoryQuery`` (``False`` from older ones: it would close the link on one).
    history: bool = False


@attrs.frozen
class Heartbeat:
    seq: int


@attrs.frozen
class HeartbeatAck:
    """``last_index``/``demand_seq``/``host_seq``: the controller's digest (protocol §6.3; all 0: no digest)."""

    seq: int
    term: int
    last_index: int = 0
    demand_seq: int = 0
    host_seq: int = 0


@attrs.frozen
class ErrorMsg:
    """ctl -> client: a connection-level error; the controller may close right after sending it."""

    code: str = _code(ERROR_CODES, "ErrorCode")
    message: str = ""


@attrs.frozen
class Rejected:
    """A typed refusal of one request (same ``corr``); the connection stays up."""

    reason: str = _code(REJECT_REASONS, "RejectReason")
    detail: str = ""


@attrs.frozen
class Ack:
    """A generic empty success reply."""


# --- leases (provisioner) --------------------------------------------------------------------------------------


@attrs.frozen
class LeaseAcquire:
    provider: str


@attrs.frozen
class LeaseRenew:
    provider: str
    epoch: Epoch


@attrs.frozen
class LeaseRelease:
    provider: str
    epoch: Epoch


@attrs.frozen
class LeaseGrant:
    """Reply to acquire or renew. The holder trusts it until ``renew_sent + ttl - margin`` on its own clock."""

    provider: str
    epoch: Epoch
    ttl_ms: int


@attrs.frozen
class LeaseDenied:
    provider: str
    reason: str = _code(DENY_REASONS, "DenyReason")
    retry_after_ms: int = 0


@attrs.frozen
class LeaseFreed:
    """ctl -> provisioner push: ``provider``'s lease ended (released or expired) after this connection was denied it
    as ``held``. A hint to acquire now rather than at ``retry_after_ms``; never a grant."""

    provider: str


# --- demand, facts, hosts --------------------------------------------------------------------------------------


@attrs.frozen
class DemandPage:
    """ctl -> provisioner push. A snapshot is pages ``0..page_count-1`` sharing one ``snapshot_seq``."""

    snapshot_seq: int
    page: int
    page_count: int
    items: tuple[DemandItem, ...] = attrs.field(converter=_demand_items, default=())
    licenses: tuple[LicenseUse, ...] = attrs.field(converter=_license_uses, default=())  # page 0 only


@attrs.frozen
class FactCommit:
    fact: Fact


@attrs.frozen
class FactAck:
    """``committed_at``: the fact's ``CommittedFact.committed_at`` (0 from a controller older than the field)."""

    index: int
    committed_at: float = 0.0


@attrs.frozen
class ResyncRequest:
    """``after_index`` 0: full; else only facts after it, if ``incarnation`` is the controller's (§6.3)."""

    providers: tuple[str, ...] = _strs()
    after_index: int = 0
    incarnation: str = ""


@attrs.frozen
class ResyncPage:
    page: int
    page_count: int
    facts: tuple[CommittedFact, ...] = attrs.field(converter=_committed_facts, default=())
    hosts: tuple[HostState, ...] = attrs.field(converter=_host_states, default=())
    incremental: bool = False
    as_of: int = 0
    host_seq: int = 0


@attrs.frozen
class HostStatePush:
    hosts: tuple[HostState, ...] = attrs.field(converter=_host_states, default=())
    seq: int = 0


# --- worker ----------------------------------------------------------------------------------------------------


@attrs.frozen
class WorkerStatus:
    """worker -> ctl. ``reclaim_at``/``rebalance_at``: the machine's reclaim notices (epoch seconds, 0 = none;
    protocol §6.4 "Reclaim notices"). ``capabilities``: the latest re-probe's whole report, sent once when it
    changed (empty = unchanged since the last one sent); ``probed_at``: when that re-probe ran (epoch seconds, 0 =
    none; protocol §6.4 "Health after join")."""

    status: HostStatus
    reclaim_at: float = 0.0
    rebalance_at: float = 0.0
    capabilities: Mapping[str, str] = attrs.field(factory=dict)
    probed_at: float = 0.0


# --- admin -----------------------------------------------------------------------------------------------------


@attrs.frozen
class AdminSetDemand:
    items: tuple[DemandItem, ...] = attrs.field(converter=_demand_items, default=())
    licenses: tuple[LicenseUse, ...] = attrs.field(converter=_license_uses, default=())


@attrs.frozen
class AdminFailover:
    target: int = -1  # replica index; -1 = the next replica


@attrs.frozen
class AdminQuorum:
    fresh: bool


@attrs.frozen
class AdminStatus:
    pass


@attrs.frozen
class AdminReply:
    ok: bool
    json: str = ""


# --- history ---------------------------------------------------------------------------------------------------


@attrs.frozen
class HistoryQuery:
    """A page of the fact log after index ``after_index`` (ended lifecycles included; docs/protocol.md §6.6)."""

    providers: tuple[str, ...] = _strs()
    after_index: int = 0
    until_index: int = 0
    max_facts: int = 0


@attrs.frozen
class HistoryPage:
    facts: tuple[CommittedFact, ...] = attrs.field(converter=_committed_facts, default=())
    next_after: int = 0
    until_index: int = 0
    done: bool = True


Message = (
    Join
    | JoinReply
    | Heartbeat
    | HeartbeatAck
    | ErrorMsg
    | Rejected
    | Ack
    | LeaseAcquire
    | LeaseRenew
    | LeaseRelease
    | LeaseGrant
    | LeaseDenied
    | DemandPage
    | FactCommit
    | FactAck
    | ResyncRequest
    | ResyncPage
    | HostStatePush
    | WorkerStatus
    | AdminSetDemand
    | AdminFailover
    | AdminQuorum
    | AdminStatus
    | AdminReply
    | LeaseFreed
    | HistoryQuery
    | HistoryPage
)

#: Every message class, in the order of the ``Frame.body`` union in the schema.
MESSAGE_TYPES: tuple[type, ...] = Message.__args__


@attrs.frozen
class Envelope:
    """A decoded frame: the correlation id (echoed in replies, 0 for pushes) and the message."""

    corr: int
    msg: Message
