"""The provider contract as values: what the typed client (``provisionerd.provider.client``) takes and returns.

Frozen and pure. The documents these values stand for are defined by ``schemas/`` and explained in
``docs/providers.md``; the conversions both ways are ``provisionerd.provider.contract``. Where the domain already has
the value it is used as is: a template on offer is an ``Offer`` and a machine a provider reports, in a request's
status or in a listing, is a ``ProviderMachine`` (``provisionerd.domain.model``).

Per action::

    describeProvider        ()                                   -> ProviderDescription (its Features)
    getAvailableTemplates   ()                                   -> tuple[Offer, ...]
    requestMachines         MachineRequest (OwnerTags, Bootstrap) -> RequestAccepted
    getRequestStatus        request ids                          -> tuple[RequestStatus, ...] (ProviderMachine)
    requestReturnMachines   MachineReturn (MachineRef, OwnerTags) -> RequestAccepted
    stopMachines            MachineReturn                        -> RequestAccepted
    getReturnRequests       MachineRef, ... (and tags to match)  -> tuple[Reclaim, ...]  (tags: features.reclaimsByTags)
    listMachines            tags to match                        -> tuple[ListingRow, ...]
    listLicenses            tags to match                        -> tuple[LicenseGrant, ...]  (features.licensePools)
    returnLicenses          LicenseReturn (OwnerTags)            -> RequestAccepted            (features.licensePools)

``MachineRequest`` holds the join tokens (in its ``Bootstrap`` entries, kept out of ``repr``): never log it, never
keep it beyond the call.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import attrs
import msgspec

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    Epoch,
    ProviderMachine,
)
from provisionerd.domain.tokens import IssuedToken

#: Request statuses after which ``getRequestStatus`` will not change any more.
FINAL_STATUSES = frozenset({"complete", "complete_with_error"})


# --- listMachines -------------------------------------------------------------------------------------------------

#: The ``listMachines`` page's fields, as strict as the schema says (``schemas/defs.json``: ``listedMachine``), so a
#: page decoded into ``ListingPage`` is one the schema takes (tests/provider/test_listing_decode.py). A launch time is
#: a whole number of seconds, at least 0, that a double holds (a row keeps it as a float).
_LAUNCH = Annotated[float, msgspec.Meta(ge=0, le=sys.float_info.max, multiple_of=1)]
_MACHINE_ID = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
_NAME = Annotated[str, msgspec.Meta(max_length=1024)]
_STATUS = Annotated[str, msgspec.Meta(max_length=256)]
_ADDRESS = Annotated[str, msgspec.Meta(max_length=64)]
_TAGS = dict[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], Annotated[str, msgspec.Meta(max_length=256)]]
_CURSOR = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class ListingRow(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A machine as a ``listMachines`` page shows it (a ``ListedMachine``; ``machine()`` is its ``ProviderMachine``).

    Why not a ``ProviderMachine``: an orphan pass lists the whole fleet every interval and needs a full machine only
    for the few it finds. A page of the usual shape decodes into these rows in one call (``ListingPage``), which
    checks each field in C; a frozen attrs ``ProviderMachine`` per machine on top cost 0.8 us more (its
    ``__init__``: ~0.1 s of CPU a pass at 100k machines) and ~120 bytes. Not tracked by the cyclic collector (no
    field can hold a cycle). The fields keep the contract's JSON names (``machineId``...) and its bounds; the
    attributes are ``ProviderMachine``'s. ``instanceRef`` (not in the schema) is read when it is a string or null.
    Immutable like every value here (its tags are its own dict, read only)."""

    machine_id: _MACHINE_ID = msgspec.field(name="machineId")
    launch_time: _LAUNCH = msgspec.field(name="launchtime")
    name: _NAME
    status: _STATUS
    ip: _ADDRESS | None = msgspec.field(default=None, name="privateIpAddress")
    tags: _TAGS
    ref: str | None = msgspec.field(default=None, name="instanceRef")

    @property
    def address(self) -> str:
        return self.ip or ""

    @property
    def instance_ref(self) -> str:
        """The instance tag, else the contract's ``instanceRef``, else ``""`` (as ``ProviderMachine.instance_ref``
        is read from a listing)."""
        return self.tags.get(TAG_INSTANCE) or self.ref or ""

    def machine(self) -> ProviderMachine:
        return ProviderMachine(
            self.machine_id,
            self.name,
            "succeed",
            self.status,
            self.launch_time,
            self.address,
            self.instance_ref,
            dict(self.tags),
        )

    @classmethod
    def of(cls, machine: ProviderMachine) -> ListingRow:
        """The row of a listed ``machine`` read entry by entry (a page of another shape)."""
        return cls(
            machine_id=machine.machine_id,
            launch_time=machine.launch_time,
            name=machine.name,
            status=machine.status,
            ip=machine.address,
            tags=dict(machine.tags),
            ref=machine.instance_ref,
        )


class ListingPage(msgspec.Struct, frozen=True, gc=False):
    """One ``listMachines`` page decoded straight into rows (``contract.decode_listing_page``): the schema's
    ``listMachines.output`` where it is regular (anything else is read as before: parsed, checked, entry by entry).
    ``nextCursor`` absent or null: the last page."""

    machines: list[ListingRow]
    nextCursor: _CURSOR | None = None  # noqa: N815 (the contract's name)


class PageAnswer(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """A persistent plugin's answer line whose result is a regular ``ListingPage``
    (``contract.decode_page_answer``). No other member: a line that also has an ``error`` is not an answer."""

    id: int
    result: ListingPage


# --- describeProvider ----------------------------------------------------------------------------------------------


@attrs.frozen
class Features:
    """What a plugin declares it really supports (``describeProvider``'s ``features``; absent means false)."""

    idempotent_request: bool = False
    list_machines: bool = False
    stop_machines: bool = False
    tags: bool = False
    price_quotes: bool = False
    license_pools: bool = False  # listLicenses/returnLicenses: it holds licence pools for the cluster (class d)
    #: ``requestMachines`` with ``allOrNothing`` creates every machine or none (EC2's ``MinCount``)
    all_or_nothing: bool = False
    #: ``getReturnRequests`` with ``tags`` also answers every machine carrying them: the reclaim poll asks once by
    #: the owner tags instead of naming every live machine, 2,000 a call
    reclaims_by_tags: bool = False

    @classmethod
    def from_mapping(cls, features: Mapping[str, Any]) -> Features:
        """From the document's names (``{"idempotentRequest": true, ...}``); anything but ``true`` is false."""
        return cls(*(features.get(key) is True for key in _FEATURE_KEYS))

    def as_mapping(self) -> dict[str, bool]:
        """The document's names, as the pure rules of ``provisionerd.provider.legacy.rules`` take them."""
        return dict(zip(_FEATURE_KEYS, attrs.astuple(self), strict=True))


_FEATURE_KEYS = (
    "idempotentRequest",
    "listMachines",
    "stopMachines",
    "tags",
    "priceQuotes",
    "licensePools",
    "allOrNothing",
    "reclaimsByTags",
)


@attrs.frozen
class ProviderDescription:
    """Who the plugin is (``describeProvider``)."""

    name: str
    version: str
    contract_version: int
    features: Features


# --- mutations' inputs ---------------------------------------------------------------------------------------------


@attrs.frozen
class OwnerTags:
    """The owner tags of one mutation: the plugin puts them (plus ``provisionerd:instance``) on every machine it
    creates, and the op_id is the mutation's idempotency key."""

    cluster: str
    provider: str
    op_id: str
    epoch: Epoch

    def as_tags(self) -> dict[str, str]:
        return {TAG_CLUSTER: self.cluster, TAG_PROVIDER: self.provider, TAG_OP: self.op_id, TAG_EPOCH: str(self.epoch)}


@attrs.frozen
class MachineLimits:
    """How long a new machine may live on its own (seconds, 0 = no limit): ``orphan_timeout`` (the daemon's
    ``worker_orphan_timeout``: its agent gives up after that long without reaching a controller) and
    ``max_lifetime`` (the provider's ``max_ttl``, for providers that can enforce it, such as Slurm's ``--time``)."""

    orphan_timeout: float = 0.0
    max_lifetime: float = 0.0


@attrs.frozen
class Bootstrap:
    """What one new machine needs to join: its instance ref, the controllers, and its single-use join token."""

    instance_ref: str
    controllers: tuple[str, ...]
    join_token: str = attrs.field(repr=False)
    limits: MachineLimits = MachineLimits()


@attrs.frozen
class MachineRequest:
    """``requestMachines``: one machine of ``template_id`` per ``bootstrap`` entry, in order, under ``owner``."""

    template_id: str
    owner: OwnerTags
    bootstrap: tuple[Bootstrap, ...]
    #: Every machine or none (only sent to a plugin whose features say ``allOrNothing``).
    all_or_nothing: bool = False

    @classmethod
    def of(
        cls,
        owner: OwnerTags,
        template_id: str,
        issued: Sequence[IssuedToken],
        controllers: Sequence[str],
        limits: MachineLimits = MachineLimits(),
        all_or_nothing: bool = False,
    ) -> MachineRequest:
        """One machine per issued token (``provisionerd.domain.tokens.issue``), each told the same controllers
        and ``limits``."""
        boots = tuple(Bootstrap(t.instance_ref, tuple(controllers), t.token, limits) for t in issued)
        return cls(template_id, owner, boots, all_or_nothing)

    @property
    def op_id(self) -> str:
        return self.owner.op_id

    @property
    def count(self) -> int:
        return len(self.bootstrap)


@attrs.frozen
class MachineRef:
    """A machine named to the provider: its id and, when known, its name."""

    machine_id: str
    name: str = ""


@attrs.frozen
class MachineReturn:
    """``requestReturnMachines`` (or ``stopMachines``): give ``machines`` back under ``owner``."""

    machines: tuple[MachineRef, ...]
    owner: OwnerTags

    @property
    def op_id(self) -> str:
        return self.owner.op_id


@attrs.frozen
class LicenseReturn:
    """``returnLicenses``: check ``count`` units of ``pool`` back in under ``owner`` (its op_id is the key)."""

    pool: str
    count: int
    owner: OwnerTags

    @property
    def op_id(self) -> str:
        return self.owner.op_id


# --- outputs -------------------------------------------------------------------------------------------------------


@attrs.frozen
class RequestAccepted:
    """A mutation the provider accepted: follow ``request_id`` with ``getRequestStatus``."""

    request_id: str
    message: str = ""


@attrs.frozen
class RequestStatus:
    """One create or return request as ``getRequestStatus`` reports it. ``status`` is ``running``, ``complete`` or
    ``complete_with_error``; each machine's ``result`` is ``executing``, ``succeed`` or ``fail``."""

    request_id: str
    status: str
    message: str
    machines: tuple[ProviderMachine, ...]

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


def status_for(statuses: Sequence[RequestStatus], request_id: str) -> RequestStatus | None:
    """The status of ``request_id`` among ``statuses`` (``None`` if the provider left it out)."""
    return next((s for s in statuses if s.request_id == request_id), None)


#: How a plugin says it does not know a request id (the contract: ``complete_with_error``, no machines, this message).
UNKNOWN_REQUEST = "unknown request"


def foreign_request(
    statuses: Sequence[RequestStatus], request_id: str, answered_by: str = "requestMachines"
) -> str | None:
    """Why the answer to ``getRequestStatus([request_id])`` shows that the plugin does not know ``request_id``, the
    id its own ``answered_by`` call answered (``None``: it knows it, or said nothing yet). Either it reports the id
    as an unknown request, or it answers only about other ids. A protocol violation: the call's outcome is unknown,
    not "nothing made" (issue 31, finding 3)."""
    status = status_for(statuses, request_id)
    if status is None:
        got = sorted({s.request_id for s in statuses})[:5]
        if not got:
            return None
        return f"getRequestStatus answered about {got} when asked about {request_id!r}, which {answered_by} answered"
    if status.final and not status.machines and status.message.lower().startswith(UNKNOWN_REQUEST):
        return (
            f"getRequestStatus does not know {request_id!r}, the requestId {answered_by} answered "
            f"({status.message[:200]})"
        )
    return None


@attrs.frozen
class Reclaim:
    """A machine the provider wants back (``getReturnRequests``: spot capacity, maintenance). ``machine_id`` may be
    empty (an LSF plugin names machines only); ``grace_period`` is the seconds left, ``None`` when not said."""

    name: str
    machine_id: str = ""
    grace_period: int | None = None


@attrs.frozen
class LicenseGrant:
    """One licence pool's grant to the cluster as the licence source sees it (``listLicenses``): ``granted`` units
    checked out, ``in_use`` of them in use by the source's own count, ``checked_out`` the epoch seconds the oldest
    unit still granted was checked out (0: unknown, then nothing is returned automatically)."""

    pool: str
    granted: int
    in_use: int
    checked_out: float = 0.0


@attrs.frozen
class UnknownOutcome:
    """A create request whose call has an unknown outcome and that no listing can settle (the legacy adapter's
    journal): whatever it made is invisible, so the orphan report names it."""

    op_id: str
    template_id: str
    instance_refs: tuple[str, ...]
    detail: str
    #: What the plugin's own state file records that the journal does not account for (``legacy.state_files``),
    #: where that file is, and, when nothing could be read, exactly what cannot be seen.
    plugin_records: tuple[Mapping[str, Any], ...] = ()
    records_from: str = ""
    cannot_see: str = ""

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> UnknownOutcome:
        return cls(
            str(document["op_id"]),
            str(document.get("template", "")),
            tuple(str(r) for r in document.get("instance_refs", ())),
            str(document.get("detail") or ""),
            tuple(r for r in document.get("plugin_records", ()) if isinstance(r, Mapping)),
            str(document.get("records_from") or ""),
            str(document.get("cannot_see") or ""),
        )

    def as_json(self) -> dict[str, Any]:
        """The orphan report's and the events' shape: ``{"op_id", "template", "instance_refs", "detail"}``, and
        ``plugin_records``/``records_from`` or ``cannot_see`` when the adapter says what it could (not) read."""
        document: dict[str, Any] = {
            "op_id": self.op_id,
            "template": self.template_id,
            "instance_refs": list(self.instance_refs),
            "detail": self.detail,
        }
        if self.records_from:
            document["records_from"] = self.records_from
            document["plugin_records"] = [dict(r) for r in self.plugin_records]
        if self.cannot_see:
            document["cannot_see"] = self.cannot_see
        return document
