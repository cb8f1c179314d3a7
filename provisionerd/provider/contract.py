"""The contract's documents from values, and values from documents: one writer per input, one reader per output.

Pure (no I/O). Inputs follow ``schemas/<action>.input.json``; the transport validates them again before sending, so a
writer bug is a ``ProviderInputInvalid`` with nothing sent. Outputs are read *after* the transport validated them
against ``schemas/<action>.output.json``, so a reader only chooses what the daemon keeps (extra fields a plugin adds
are dropped, except where noted). A reader still raises ``ProviderProtocolViolation`` for a document without the
shape (a transport that skipped its check): never a ``KeyError`` from deep inside the daemon.

How machines are read, the same for every caller:

- a ``getRequestStatus`` machine names its bootstrap by ``instanceRef`` (the contract's field), else by its
  ``provisionerd:instance`` tag; a missing ``launchtime`` is 0 (unknown), a missing address "";
- a ``listMachines`` machine is live (``result`` "succeed") and names its bootstrap by its ``provisionerd:instance``
  tag, else by an ``instanceRef`` field (not in the listing's schema, but the legacy adapter's op listing has only
  that, its machines carry no tags).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import msgspec

from provisionerd.domain.errors import ProviderAnswerInvalid
from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    Offer,
    PriceQuote,
    ProviderMachine,
)
from provisionerd.provider.values import (
    Bootstrap,
    Features,
    LicenseGrant,
    LicenseReturn,
    ListingPage,
    ListingRow,
    MachineRef,
    MachineRequest,
    MachineReturn,
    PageAnswer,
    ProviderDescription,
    Reclaim,
    RequestAccepted,
    RequestStatus,
)

#: Most templates accepted from one provider in one read (bounded memory whatever a plugin says).
MAX_TEMPLATES = 10_000


#: What a reader raises on a document without the shape. ``OverflowError``: an integer the schema allows (no upper
#: bound) that is no float, e.g. a ``launchtime`` of 400 digits.
_UNREADABLE = (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError)


class _reading:  # noqa: N801 - used as ``with _reading(provider, action):``, like the function it replaced
    """Turns what a reader raises on a document without the shape into ``ProviderAnswerInvalid``. A class, not a
    ``contextmanager`` generator: that cost ~0.6 us of every poll's read (issue 36, item 4)."""

    __slots__ = ("action", "provider")

    def __init__(self, provider: str, action: str) -> None:
        self.provider = provider
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None or not isinstance(exc, _UNREADABLE):
            return
        # Past the schema (a transport that skipped its check): where is not known, what is. A KeyError names the
        # key; other messages may quote a value, so only their type is said.
        what = f"key {exc.args[0]!r} missing" if isinstance(exc, KeyError) and exc.args else type(exc).__name__
        raise ProviderAnswerInvalid(self.provider, self.action, [("$", f"readable: {what}"[:200])]) from None


# --- tag filters (listMachines) ------------------------------------------------------------------------------------


def cluster_filter(cluster: str) -> dict[str, str]:
    """Every live machine carrying this cluster's id tag (the contract requires the cluster in every filter)."""
    return {TAG_CLUSTER: cluster}


def op_filter(cluster: str, provider: str, op_id: str) -> dict[str, str]:
    """What ``op_id`` created."""
    return {TAG_CLUSTER: cluster, TAG_PROVIDER: provider, TAG_OP: op_id}


# --- inputs --------------------------------------------------------------------------------------------------------


def request_input(request: MachineRequest) -> dict[str, Any]:
    """The ``requestMachines`` input. It holds the join tokens: never log it, never keep it beyond the call.
    ``allOrNothing`` only when asked (a plugin that predates it never sees it)."""
    document: dict[str, Any] = {
        "template": {"templateId": request.template_id, "machineCount": request.count},
        "op_id": request.op_id,
        "tags": request.owner.as_tags(),
        "bootstrap": [_bootstrap(b) for b in request.bootstrap],
    }
    if request.all_or_nothing:
        document["allOrNothing"] = True
    return document


def _bootstrap(boot: Bootstrap) -> dict[str, Any]:
    """One ``bootstrap`` entry; the optional limits only when set (a plugin that predates them never sees them)."""
    entry: dict[str, Any] = {
        "instanceRef": boot.instance_ref,
        "controllers": list(boot.controllers),
        "joinToken": boot.join_token,
    }
    if boot.limits.orphan_timeout > 0:
        entry["orphanTimeout"] = boot.limits.orphan_timeout
    if boot.limits.max_lifetime > 0:
        entry["maxLifetime"] = boot.limits.max_lifetime
    return entry


def machine_refs(machines: Sequence[MachineRef]) -> list[dict[str, str]]:
    return [{"name": m.name, "machineId": m.machine_id} for m in machines]


def return_input(request: MachineReturn) -> dict[str, Any]:
    """The ``requestReturnMachines`` / ``stopMachines`` input."""
    return {"machines": machine_refs(request.machines), "op_id": request.op_id, "tags": request.owner.as_tags()}


def status_input(request_ids: Sequence[str]) -> dict[str, Any]:
    """The ``getRequestStatus`` input (at least one id)."""
    return {"requests": [{"requestId": request_id} for request_id in request_ids]}


def reclaims_input(machines: Sequence[MachineRef], tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``getReturnRequests`` input: the machines the daemon knows, and (only to a plugin whose features say
    ``reclaimsByTags``) the tags of every other machine to answer for (which must name the cluster)."""
    document: dict[str, Any] = {"machines": machine_refs(machines)}
    if tags is not None:
        document["tags"] = dict(tags)
    return document


def listing_input(tags: Mapping[str, str]) -> dict[str, Any]:
    """The ``listMachines`` input: machines carrying all of ``tags`` (which must name the cluster)."""
    return {"tags": dict(tags)}


def licenses_input(tags: Mapping[str, str]) -> dict[str, Any]:
    """The ``listLicenses`` input: the grants held for the cluster named in ``tags``."""
    return {"tags": dict(tags)}


def license_return_input(request: LicenseReturn) -> dict[str, Any]:
    """The ``returnLicenses`` input: one pool, ``count`` units, under the owner tags (op_id is the key)."""
    return {
        "op_id": request.op_id,
        "tags": request.owner.as_tags(),
        "licenses": [{"pool": request.pool, "count": request.count}],
    }


# --- outputs -------------------------------------------------------------------------------------------------------


def read_description(provider: str, document: Mapping[str, Any]) -> ProviderDescription:
    with _reading(provider, "describeProvider"):
        features = document["features"]
        if not isinstance(features, Mapping):
            raise TypeError("features is not an object")
        return ProviderDescription(
            str(document["name"]),
            str(document.get("version", "")),
            int(document["contractVersion"]),
            Features.from_mapping(features),
        )


def read_offers(provider: str, document: Mapping[str, Any]) -> tuple[Offer, ...]:
    """The ``getAvailableTemplates`` output as ``provider``'s offers; more than ``MAX_TEMPLATES`` is refused."""
    action = "getAvailableTemplates"
    templates = document.get("templates")
    if not isinstance(templates, list):
        raise ProviderAnswerInvalid(provider, action, [("$.templates", 'type: must be of type "array"')])
    if len(templates) > MAX_TEMPLATES:
        raise ProviderAnswerInvalid(
            provider, action, [("$.templates", f"maxItems: must have at most {MAX_TEMPLATES} items")]
        )
    offers = []
    for i, entry in enumerate(templates):
        try:
            attributes = {str(k): (str(v[0]), str(v[1])) for k, v in entry.get("attributes", {}).items()}
            price = _quote(entry.get("price"))
            offers.append(Offer(provider, str(entry["templateId"]), int(entry["maxNumber"]), attributes, price))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            what = f"key {exc.args[0]!r} missing" if isinstance(exc, KeyError) and exc.args else type(exc).__name__
            raise ProviderAnswerInvalid(provider, action, [(f"$.templates[{i}]", f"readable: {what}"[:200])]) from None
    return tuple(offers)


def read_accepted(provider: str, action: str, document: Mapping[str, Any]) -> RequestAccepted:
    """The output of ``requestMachines``, ``requestReturnMachines`` or ``stopMachines``."""
    with _reading(provider, action):
        return RequestAccepted(str(document["requestId"]), str(document.get("message") or ""))


def _quote(quote: Any) -> PriceQuote | None:
    """A price quote of an answer (``None`` when absent); ``KeyError``/``TypeError``/``ValueError`` when malformed."""
    if quote is None:
        return None
    amount = float(quote["amount"])
    if not math.isfinite(amount):
        raise ValueError("price amount is not finite")
    return PriceQuote(amount, str(quote["currency"]), str(quote["unit"]), str(quote["source"]), str(quote["timestamp"]))


def _tags(entry: Mapping[str, Any]) -> dict[str, str]:
    tags = entry.get("tags") or {}
    if not isinstance(tags, Mapping):
        raise TypeError("tags must be an object")
    return {str(k): str(v) for k, v in tags.items()}


def status_machine(entry: Mapping[str, Any]) -> ProviderMachine:
    """One machine of a ``getRequestStatus`` entry (see the module docstring)."""
    if type(entry) is dict:
        machine = _status_machine_plain(entry)
        if machine is not None:
            return machine
    return _status_machine_read(entry)


def _status_machine_plain(entry: dict[str, Any]) -> ProviderMachine | None:
    """``status_machine`` for the shape a validated answer has (every text field a ``str`` or absent, tags a
    ``dict`` of ``str``, ``launchtime`` an ``int`` or absent), without the conversions that change nothing on it;
    None for any other shape, which the full reader then reads. The same value either way
    (tests/provider/test_typed_client.py compares the two): ``str`` of a ``str`` is itself, and the tags are a
    copy as before. Polls read the same machines over and over, so this is most of what a poll costs to read."""
    if "price" in entry or "instanceType" in entry:
        return None  # what the machine really got: the full reader reads it
    get = entry.get
    machine_id = get("machineId")
    name = get("name") or ""
    result = get("result", "succeed")
    status = get("status") or ""
    address = get("privateIpAddress") or ""
    ref = get("instanceRef") or ""
    launch = get("launchtime") or 0
    tags = get("tags") or {}
    if not (
        type(machine_id) is str
        and type(name) is str
        and type(result) is str
        and type(status) is str
        and type(address) is str
        and type(ref) is str
        and type(launch) is int
        and type(tags) is dict
    ):
        return None
    if not _plain_tags(tags):
        return None
    tags = tags.copy()
    return ProviderMachine(
        machine_id, name, result, status, float(launch), address, ref or tags.get(TAG_INSTANCE) or "", tags
    )


def _plain_tags(tags: dict[Any, Any]) -> bool:
    """Whether every tag key and value is a ``str`` (the fast readers' condition; otherwise the full one reads)."""
    for key, value in tags.items():  # a loop, not all(<generator>): this runs for every machine of a listing
        if type(key) is not str or type(value) is not str:
            return False
    return True


def _status_machine_read(entry: Mapping[str, Any]) -> ProviderMachine:
    tags = _tags(entry)
    return ProviderMachine(
        machine_id=str(entry["machineId"]),
        name=str(entry.get("name") or ""),
        result=str(entry.get("result", "succeed")),
        status=str(entry.get("status") or ""),
        launch_time=float(entry.get("launchtime") or 0),
        address=str(entry.get("privateIpAddress") or ""),
        instance_ref=str(entry.get("instanceRef") or tags.get(TAG_INSTANCE) or ""),
        tags=tags,
        instance_type=str(entry.get("instanceType") or ""),
        price=_quote(entry.get("price")),
    )


class _Polled(msgspec.Struct, frozen=True, gc=False):
    """A ``getRequestStatus`` machine of the shape a validated answer has, without ``price`` or ``instanceType``
    (an answer that says either is read entry by entry, by the readers that read them)."""

    machineId: str  # noqa: N815 - the contract's names
    name: str | None = ""
    result: str = "succeed"
    status: str | None = ""
    privateIpAddress: str | None = None  # noqa: N815
    instanceRef: str | None = None  # noqa: N815
    launchtime: int | None = 0
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    price: msgspec.UnsetType = msgspec.UNSET
    instanceType: msgspec.UnsetType = msgspec.UNSET  # noqa: N815


class _Request(msgspec.Struct, frozen=True, gc=False):
    requestId: str  # noqa: N815
    status: str
    message: str | None = ""
    machines: list[_Polled] = msgspec.field(default_factory=list)


class _Statuses(msgspec.Struct, frozen=True, gc=False):
    requests: list[_Request]


def read_statuses(provider: str, document: Mapping[str, Any]) -> tuple[RequestStatus, ...]:
    """Every request of a ``getRequestStatus`` output, in the provider's order.

    An answer of the usual shape is converted in one msgspec call (``_Statuses``) and read from that, as
    ``read_machines`` reads a listing page: 8.4 us for a four-machine answer against 10.0-12.5 entry by entry
    (issue 36, side by side in one process). Any other answer is read entry by entry, as before. The same values
    either way (tests/provider/test_fast_paths.py)."""
    with _reading(provider, "getRequestStatus"):
        try:
            answer = msgspec.convert(document, _Statuses)
        except msgspec.ValidationError:
            return tuple(
                RequestStatus(
                    str(entry["requestId"]),
                    str(entry["status"]),
                    str(entry.get("message") or ""),
                    tuple(status_machine(m) for m in entry.get("machines", ())),
                )
                for entry in document["requests"]
            )
        return tuple(
            [
                RequestStatus(
                    request.requestId,
                    request.status,
                    request.message or "",
                    tuple(
                        [
                            ProviderMachine(
                                m.machineId,
                                m.name or "",
                                m.result,
                                m.status or "",
                                float(m.launchtime or 0),
                                m.privateIpAddress or "",
                                m.instanceRef or m.tags.get(TAG_INSTANCE) or "",
                                m.tags,
                            )
                            for m in request.machines
                        ]
                    ),
                )
                for request in answer.requests
            ]
        )


def listed_machine(entry: Mapping[str, Any]) -> ProviderMachine:
    """One machine of a ``listMachines`` output (see the module docstring)."""
    if type(entry) is dict:
        machine = _listed_machine_plain(entry)
        if machine is not None:
            return machine
    return _listed_machine_read(entry)


def _listed_machine_plain(entry: dict[str, Any]) -> ProviderMachine | None:
    """``listed_machine`` for the shape a validated listing has (texts ``str``, the address ``str`` or absent or
    null, ``launchtime`` an ``int``, tags a ``dict`` of ``str``), without the conversions that change nothing on
    it; None for any other shape, which the full reader then reads. The same value either way
    (tests/provider/test_fast_paths.py compares the two), as ``_status_machine_plain`` is for a poll: an orphan
    pass reads every machine of the fleet, ~2 us each this way against ~4 us (issue 36, item 3)."""
    get = entry.get
    machine_id = get("machineId")
    name = get("name") or ""
    status = get("status") or ""
    launch = get("launchtime")
    address = get("privateIpAddress") or ""
    tags = get("tags") or {}
    if not (
        type(machine_id) is str
        and type(name) is str
        and type(status) is str
        and type(launch) is int
        and type(address) is str
        and type(tags) is dict
    ):
        return None
    if not _plain_tags(tags):
        return None
    ref = tags.get(TAG_INSTANCE) or get("instanceRef") or ""
    if type(ref) is not str:
        return None
    return ProviderMachine(machine_id, name, "succeed", status, float(launch), address, ref, tags.copy())


def _listed_machine_read(entry: Mapping[str, Any]) -> ProviderMachine:
    tags = _tags(entry)
    launch = entry["launchtime"]
    if isinstance(launch, bool) or not isinstance(launch, (int, float)) or not math.isfinite(launch):
        raise TypeError("launchtime must be a number")
    return ProviderMachine(
        machine_id=str(entry["machineId"]),
        name=str(entry.get("name") or ""),
        result="succeed",
        status=str(entry.get("status") or ""),
        launch_time=float(launch),
        address=str(entry.get("privateIpAddress") or ""),
        instance_ref=str(tags.get(TAG_INSTANCE) or entry.get("instanceRef") or ""),
        tags=tags,
    )


_ROWS = list[ListingRow]
_PAGE_DECODE = msgspec.json.Decoder(ListingPage).decode


def decode_listing_page(raw: bytes | memoryview) -> ListingPage | None:
    """A ``listMachines`` answer's JSON decoded straight into its rows when the page is regular, or ``None``.

    Regular: every field the schema bounds within its bounds (``ListingPage``'s types say no more than the schema),
    each ``instanceRef`` a string or null, and every ``launchtime`` one a double holds. Such a page needs no other
    check, and its rows are those that parsing it, checking it and ``read_machines`` give
    (tests/provider/test_listing_decode.py). Any other answer, including one the schema refuses, is ``None``: the
    caller reads it as before, which says what is wrong. Measured on a 500-machine page: 0.43 ms against 0.77 to
    parse, check and read it (issue 36)."""
    try:
        return _PAGE_DECODE(raw)
    except msgspec.MsgspecError:
        return None


_ANSWER_DECODE = msgspec.json.Decoder(PageAnswer).decode


def decode_page_answer(line: bytes) -> PageAnswer | None:
    """A persistent plugin's answer line ``{"id": <int>, "result": <page>}`` decoded in one pass when its page is
    regular (``decode_listing_page``), else ``None``: the caller reads the line as every other answer
    (``lines.parse_answer``), which says what is wrong with it. What it gives is what ``parse_answer`` reads of
    the line, its result then decoded as a page (a member given twice counts once, its last value). One pass
    instead of two (the answer's members, then its result): ~18 ms less of an orphan pass's CPU at 100k machines."""
    try:
        return _ANSWER_DECODE(line)
    except msgspec.MsgspecError:
        return None


def read_machines(provider: str, document: Mapping[str, Any]) -> tuple[ListingRow, ...]:
    """The machines of a ``listMachines`` output, as ``ListingRow``s (``row.machine()`` is the ``ProviderMachine``).

    A page of the usual shape is converted into its rows in one call (msgspec checks each field's type in C, and
    copies the tags): 0.34 us a machine, against 1.6 us when it also built a ``ProviderMachine`` per machine and 2.5
    entry by entry (issue 36, measured side by side in one process). Any other page is read entry by entry
    (``listed_machine``, which refuses what the daemon cannot read) and each machine made a row. Either way the same
    values (tests/provider/test_fast_paths.py compares them); for a document ``parse_json`` made, the same types
    too (msgspec keeps a ``str`` subclass, which JSON never gives)."""
    with _reading(provider, "listMachines"):
        machines = document["machines"]
        if not isinstance(machines, list):
            raise TypeError("machines is not a list")
        try:
            return tuple(msgspec.convert(machines, _ROWS))
        except msgspec.ValidationError:
            return tuple([ListingRow.of(listed_machine(m)) for m in machines])


def read_reclaims(provider: str, document: Mapping[str, Any]) -> tuple[Reclaim, ...]:
    """The machines of a ``getReturnRequests`` output (its ``status`` and ``message`` say nothing to act on)."""
    with _reading(provider, "getReturnRequests"):
        reclaims = []
        for entry in document["requests"]:
            grace = entry.get("gracePeriod")
            reclaims.append(
                Reclaim(
                    str(entry["machine"]),
                    str(entry.get("machineId") or ""),
                    None if grace is None else int(grace),
                )
            )
        return tuple(reclaims)


#: Most licence pools accepted from one provider in one read (bounded memory whatever a plugin says).
MAX_LICENSE_POOLS = 10_000


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000_000:
        raise ValueError("a licence count must be an integer in 0..1e9")
    return value


def read_licenses(provider: str, document: Mapping[str, Any]) -> tuple[LicenseGrant, ...]:
    """The grants of one ``listLicenses`` page. A grant that claims more units in use than granted is refused
    (the source contradicts itself: no decision can rest on it), so is a non-finite ``checkedOut``."""
    action = "listLicenses"
    entries = document.get("licenses")
    if not isinstance(entries, list):
        raise ProviderAnswerInvalid(provider, action, [("$.licenses", 'type: must be of type "array"')])
    grants = []
    for i, entry in enumerate(entries):
        try:
            granted, in_use = _count(entry["granted"]), _count(entry["inUse"])
            if in_use > granted:
                raise ValueError("inUse exceeds granted")
            since = entry["checkedOut"]
            if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
                raise ValueError("checkedOut must be finite epoch seconds")
            pool = entry["pool"]
            if not isinstance(pool, str) or not pool:
                raise ValueError("pool must be a non-empty string")
            grants.append(LicenseGrant(pool, granted, in_use, max(float(since), 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"key {exc.args[0]!r} missing" if isinstance(exc, KeyError) and exc.args else str(exc)
            if not isinstance(exc, (KeyError, ValueError)):
                what = type(exc).__name__
            raise ProviderAnswerInvalid(provider, action, [(f"$.licenses[{i}]", f"readable: {what}"[:200])]) from None
    return tuple(grants)
