"""Frozen values shared by every layer: epochs, demand, offers, facts, host states.

Nothing here does I/O or knows about trio. The wire codec, the reference controller's fact log, the reconciler and
the orphan classifier all speak these types. Times are float seconds: ``launch_time`` and ``since`` are wall-clock
epoch seconds as the provider or controller reported them; the daemon's own deadlines live elsewhere, on trio's
monotonic clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

PROTOCOL_VERSION = 1


# --- lease epochs ----------------------------------------------------------------------------------------------


@attrs.frozen(order=True)
class Epoch:
    """``(HA term, seq)``: totally ordered; unique per grant because a term has one primary."""

    term: int
    seq: int

    def __str__(self) -> str:
        return f"{self.term}.{self.seq}"

    @classmethod
    def parse(cls, text: str) -> Epoch:
        term, sep, seq = text.partition(".")
        if not sep or not term.isdigit() or not seq.isdigit():
            raise ValueError(f"epoch must look like '<term>.<seq>', not {text!r}")
        return cls(int(term), int(seq))


NO_EPOCH = Epoch(0, 0)


class Role(enum.Enum):
    CONTROLLER = "controller"
    PROVISIONER = "provisioner"
    WORKER = "worker"
    ADMIN = "admin"


# --- demand ----------------------------------------------------------------------------------------------------


@attrs.frozen
class ResourceShape:
    """What one machine must offer. ``attributes`` are extra equality constraints (e.g. ``{"zone": "a"}``)."""

    ncpus: int = 1
    mem_mb: int = 0
    gpus: int = 0
    gpu_type: str | None = None
    arch: str | None = None
    attributes: Mapping[str, str] = attrs.field(factory=dict)


#: ``DemandItem.release`` values: ``""`` returns unneeded machines after ``idle_time``; ``"on_completion"``
#: returns the machines made for the item's reservation as soon as no item of the demand names it any more.
RELEASE_IDLE = ""
RELEASE_ON_COMPLETION = "on_completion"
RELEASE_MODES = (RELEASE_IDLE, RELEASE_ON_COMPLETION)


@attrs.frozen
class DemandItem:
    """``count`` machines of ``shape`` wanted now (the whole wanted level, not a delta).

    ``providers`` restricts placement (empty = any provider this daemon serves); ``max_hourly_cost`` caps the
    price per machine-hour (``None`` = no cap; with a cap an unpriced offer is rejected); ``cost_currency`` is the
    cap's currency (empty: the cap is in the currency of every offer, unchecked; set: an offer quoted in another
    currency is rejected). ``reservation`` names the reservation the machines are for (kept on their intent);
    with ``release = "on_completion"`` they are returned at once when the reservation leaves the demand
    (docs/fleet.md). ``all_or_nothing``: see the field.
    """

    demand_id: str
    shape: ResourceShape
    count: int
    max_hourly_cost: float | None = None
    providers: tuple[str, ...] = ()
    placement: Mapping[str, str] = attrs.field(factory=dict)
    reservation: str = ""
    release: str = RELEASE_IDLE
    cost_currency: str = ""
    #: All ``count`` machines or none (an MPI job): the planner asks one offer for the whole deficit in one op,
    #: only of a provider whose plugin declares ``features.allOrNothing``, and a partial answer is returned whole
    #: (``planner.gang``, docs/fleet.md).
    all_or_nothing: bool = False


@attrs.frozen
class LicenseUse:
    """The controller's count of licence units of ``pool`` (held from ``provider``) in use by jobs."""

    provider: str
    pool: str
    in_use: int


def _license_uses(uses: Iterable[LicenseUse]) -> tuple[LicenseUse, ...]:
    return tuple(uses)


@attrs.frozen
class DemandSnapshot:
    """The controller's full wanted state. Level-triggered: a higher ``seq`` replaces everything before it.
    ``licenses``: its count of licence units in use, as of this snapshot (empty: it counts none)."""

    seq: int
    items: tuple[DemandItem, ...] = ()
    licenses: tuple[LicenseUse, ...] = attrs.field(default=(), converter=_license_uses)


# --- offers ----------------------------------------------------------------------------------------------------


@attrs.frozen
class PriceQuote:
    amount: float
    currency: str
    unit: str  # "hour"
    source: str
    timestamp: str  # RFC 3339, as the provider gave it

    @property
    def known(self) -> bool:
        """Whether this is a quote at all (``NO_QUOTE``, the default of a fact without one, is not)."""
        return bool(self.currency and self.unit)


#: The quote of a machine chosen without one (an unpriced offer, or a fact written before facts carried quotes).
NO_QUOTE = PriceQuote(0.0, "", "", "", "")


@attrs.frozen
class Offer:
    """One provider template. ``attributes`` keep the LSF shape: ``{"ncpus": ("Numeric", "8")}``."""

    provider: str
    template_id: str
    max_number: int
    attributes: Mapping[str, tuple[str, str]] = attrs.field(factory=dict)
    price: PriceQuote | None = None


# --- facts (the controller's durable log) ----------------------------------------------------------------------
# Every fact names its provider and carries the lease epoch it was written under; the controller rejects a fact
# whose epoch is not the provider's current lease epoch. ``op_id`` is the action's idempotency key.


@attrs.frozen
class RequestIntent:
    """Committed before ``requestMachines``. One instance_ref and token hash per machine, in order."""

    provider: str
    epoch: Epoch
    op_id: str
    template_id: str
    count: int
    instance_refs: tuple[str, ...]
    token_hashes: tuple[str, ...]  # hex SHA-256 of each single-use join token
    demand_id: str = ""
    #: The demand item's ``reservation`` and ``release`` when the request was planned: the machines it makes are
    #: tagged with them, so their release on completion needs no memory beyond the facts.
    reservation: str = ""
    release: str = RELEASE_IDLE
    #: The chosen offer's price quote when planned (``NO_QUOTE``: unpriced); each ``InstanceFact`` copies it.
    price: PriceQuote = NO_QUOTE
    #: The op asked for all ``count`` machines or none (``DemandItem.all_or_nothing``): if it ends with fewer, the
    #: ones it made are returned (``all_or_nothing``), by any daemon that reads the facts.
    all_or_nothing: bool = False


@attrs.frozen
class InstanceFact:
    """A machine the provider created for ``op_id``; the worker joining with ``token_hash``'s token is it."""

    provider: str
    epoch: Epoch
    op_id: str
    instance_ref: str
    machine_id: str
    template_id: str
    token_hash: str
    hostname: str = ""
    address: str = ""
    launch_time: float = 0.0
    #: The offer's price quote when the machine was chosen (``NO_QUOTE``: unpriced); ``provisionerd cost`` sums it.
    price: PriceQuote = NO_QUOTE
    #: The instance type the machine really got, when the plugin says (a template may list several:
    #: ``ProviderMachine.instance_type``); ``""``: not said (one type per template, or an older daemon).
    instance_type: str = ""


@attrs.frozen
class RequestFailed:
    """An intent ended without (more) machines: rejected, timed out, or found to have created none."""

    provider: str
    epoch: Epoch
    op_id: str
    reason: str


@attrs.frozen
class ReturnIntent:
    """Committed before ``requestReturnMachines`` (or ``stopMachines``)."""

    provider: str
    epoch: Epoch
    op_id: str
    machine_ids: tuple[str, ...]
    reason: str


@attrs.frozen
class Returned:
    provider: str
    epoch: Epoch
    op_id: str
    machine_ids: tuple[str, ...]
    #: Wall-clock epoch seconds when the return was confirmed (0 = unknown): where ``provisionerd cost`` ends a
    #: machine's spend.
    at: float = 0.0


@attrs.frozen
class Lost:
    """The machine is gone without our return (reclaimed, vanished, retired ghost)."""

    provider: str
    epoch: Epoch
    op_id: str
    machine_id: str
    reason: str


@attrs.frozen
class OrphanReported:
    provider: str
    epoch: Epoch
    op_id: str
    machine_id: str
    orphan_class: str  # never_joined | tagged_unknown | ghost | license
    evidence: str  # JSON text


@attrs.frozen
class OrphanAdopted:
    provider: str
    epoch: Epoch
    op_id: str
    machine_id: str
    instance_ref: str
    hostname: str = ""
    address: str = ""


@attrs.frozen
class DrainRequested:
    """Asks the controller to place no new work on ``machine_ids`` (past ``max_ttl``: ``planner.drain``); each is
    returned when idle, or ``drain_timeout`` after ``at`` (wall epoch seconds) busy or not. The fact is what makes
    the drain outlive a restart of the daemon."""

    provider: str
    epoch: Epoch
    op_id: str
    machine_ids: tuple[str, ...]
    reason: str
    at: float


Fact = (
    RequestIntent
    | InstanceFact
    | RequestFailed
    | ReturnIntent
    | Returned
    | Lost
    | OrphanReported
    | OrphanAdopted
    | DrainRequested
)
FACT_TYPES: tuple[type, ...] = (
    RequestIntent,
    InstanceFact,
    RequestFailed,
    ReturnIntent,
    Returned,
    Lost,
    OrphanReported,
    OrphanAdopted,
    DrainRequested,
)


@attrs.frozen
class CommittedFact:
    """A fact as stored: ``index`` is its position in the controller's log (strictly increasing).

    ``committed_at``: epoch seconds (the controller's wall clock) when the controller committed it, for the audit
    record (``provisionerd history``); 0 when not known (a controller older than the field, or a fact it committed
    before it had the field). Nothing decides on it: the log's order is ``index``.
    """

    index: int
    fact: Fact
    committed_at: float = 0.0


# --- hosts -----------------------------------------------------------------------------------------------------


class HostStatus(enum.Enum):
    JOINED = "joined"
    IDLE = "idle"
    BUSY = "busy"
    LOST = "lost"


@attrs.frozen
class HostState:
    """What the controller knows of a worker host. ``since`` is when it entered ``status`` (epoch seconds).

    ``draining``: a ``DrainRequested`` fact names the machine, so the controller places no new work on it.

    ``capabilities``: what the worker reported at its join (offer attribute names: ``ncpus``, ``mem``, ``type``
    and its template's probes, e.g. ``ngpus``), which the planner checks against its template
    (:mod:`provisionerd.planner.health`); empty when it reported nothing.

    ``reclaim_at``: the provider takes the machine back then (a spot interruption notice; epoch seconds, 0 = no
    notice); ``rebalance_at``: the provider recommended moving off it then (0 = none). Either makes the machine
    doomed: the planner replaces it and returns it (:mod:`provisionerd.planner.drain`, protocol §6.4).

    ``probed_at``: ``capabilities`` came from a re-probe the worker ran after its join, at this time (epoch seconds,
    ``WorkerStatus.probed_at``; health after join, protocol §6.4); 0 = they are the join's own report (or a
    controller older than the field)."""

    instance_ref: str
    provider: str
    machine_id: str
    status: HostStatus
    since: float
    hostname: str = ""
    address: str = ""
    draining: bool = False
    capabilities: Mapping[str, str] = attrs.field(factory=dict)
    reclaim_at: float = 0.0
    rebalance_at: float = 0.0
    probed_at: float = 0.0

    @property
    def noticed(self) -> bool:
        """The provider announced it takes the machine back, or recommended moving off it."""
        return self.reclaim_at > 0 or self.rebalance_at > 0


# --- what a provider reports -----------------------------------------------------------------------------------

#: Owner tag keys put on every resource we create (our extension of the LSF contract).
TAG_CLUSTER = "provisionerd:cluster"
TAG_PROVIDER = "provisionerd:provider"
TAG_OP = "provisionerd:op"
TAG_EPOCH = "provisionerd:epoch"
TAG_INSTANCE = "provisionerd:instance"


@attrs.frozen
class ProviderMachine:
    """A machine as ``getRequestStatus`` or ``listMachines`` reported it.

    ``result`` is the LSF machine result (``executing|succeed|fail``); ``status`` the provider's own word
    (``running``, ``pending``, ``terminated``...); ``launch_time`` epoch seconds from the provider (0 = unknown).
    """

    machine_id: str
    name: str = ""
    result: str = "executing"
    status: str = ""
    launch_time: float = 0.0
    address: str = ""
    instance_ref: str = ""
    tags: Mapping[str, str] = attrs.field(factory=dict)
    #: What the machine really got, when the plugin says (a template may list several instance types): its type
    #: and its quote (``getRequestStatus`` only; the instance fact records the quote, else the intent's).
    instance_type: str = ""
    price: PriceQuote | None = None


class ListedMachine(Protocol):
    """What a listing says of a machine, as the orphan classifier reads it: a ``ProviderMachine`` has it, and so does
    the leaner row a fleet listing is read into (``provisionerd.provider.values.ListingRow``)."""

    @property
    def machine_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def launch_time(self) -> float: ...

    @property
    def address(self) -> str: ...

    @property
    def instance_ref(self) -> str: ...

    @property
    def tags(self) -> Mapping[str, str]: ...
