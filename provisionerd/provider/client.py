"""The typed provider boundary: ``ProviderClient``, one method per contract action, frozen values in and out.

Two levels, one above the other::

    ProviderClient     typed: values in and out (provider.values), typed errors     the executor, the offer feed,
      │                                                                              the orphan cycle, the demo
    PluginClient(transport): values -> documents -> values (provider.contract)
      │
    PluginTransport    raw: call(action, document) -> document, schema-checked     one-shot, persistent, the legacy
                       both ways (provider.runtime)                                 adapter, the fakes, the kit

``ProviderReader`` is the read-only half of ``ProviderClient`` (``describeProvider``, ``getAvailableTemplates``,
``getRequestStatus``, ``getReturnRequests``, ``listMachines``): what the orphan reads and the dry-run report need,
so a client that has only these methods cannot mutate (``provisionerd.daemon.clients.ReadOnlyClient``).
Licence pools (``listLicenses``, ``returnLicenses``) are their own protocols, ``LicenseReader`` and
``LicenseClient``: only a plugin whose features say ``licensePools`` is asked, and a client without them holds none.

Errors are the transport's, unchanged, each typed (``provisionerd.domain.errors``): a refusal is the
``ProviderRejected`` subclass of its code (``Throttled``, ``CapacityUnavailable``, ``QuotaExceeded``,
``InvalidRequest``, ``AuthFailed``, ``ProviderFailed``), an unknown outcome an ``OutcomeUnknown``
(``ProviderTimeout``, ``ProviderCrashed``, ``ProviderProtocolViolation``, ``ProviderOutcomeUnknown``), and an
action the plugin lacks ``ProviderUnsupported``. A validated document the values cannot be read from is a
``ProviderProtocolViolation`` too.

Besides the calls a client says, without calling anything, what it knows of itself: ``legacy`` (an LSF plugin behind
the legacy adapter), ``known_features`` (features known without asking: the legacy adapter's, all false; ``None``
means "ask ``describe_provider``") and ``unknown_outcomes()`` (the legacy journal's requests whose outcome is
unknown).

Every method takes ``timeout`` (seconds; ``None``: the provider's configured timeout for the action), passed down to
the transport, which owns the deadline (``runtime.PluginTransport`` says why).
"""

# ruff: noqa: ASYNC109

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Protocol, runtime_checkable

import trio

from provisionerd.domain.model import Offer
from provisionerd.provider import contract
from provisionerd.provider.legacy.adapter import LegacyProvider
from provisionerd.provider.paging import (
    LIST_PAGE_SIZE,
    READ_SLICE,
    RECLAIM_CHUNK,
    PageJoin,
    max_pages,
    next_cursor,
    page_input,
)
from provisionerd.provider.runtime import PluginTransport
from provisionerd.provider.values import (
    Features,
    LicenseGrant,
    LicenseReturn,
    ListingPage,
    ListingRow,
    MachineRef,
    MachineRequest,
    MachineReturn,
    ProviderDescription,
    Reclaim,
    RequestAccepted,
    RequestStatus,
    UnknownOutcome,
)

#: Given a listing page's rows, the rows to keep of it (``list_machines``).
Sift = Callable[[list[ListingRow]], list[ListingRow]]


@runtime_checkable
class PageTransport(Protocol):
    """A transport that can hand over a ``listMachines`` page already decoded into its rows when the page is regular
    (the persistent one: ``PersistentProvider.list_page``), else the checked document as ``call`` gives it."""

    async def list_page(
        self,
        input: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> ListingPage | dict[str, Any]: ...


@runtime_checkable
class ProviderReader(Protocol):
    """The read-only actions of a provider, typed (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def legacy(self) -> bool: ...

    @property
    def known_features(self) -> Features | None: ...

    def unknown_outcomes(self) -> tuple[UnknownOutcome, ...]: ...

    def calls_running(self) -> frozenset[str]:
        """The ops of create calls an earlier daemon process started that still run (a legacy one-shot plugin's;
        empty for every other kind): recovery waits for them instead of judging them."""
        ...

    async def describe_provider(self, *, timeout: float | None = None) -> ProviderDescription: ...

    async def get_available_templates(self, *, timeout: float | None = None) -> tuple[Offer, ...]:
        """The provider's templates, as its offers (``Offer.provider`` is the client's ``name``)."""
        ...

    async def get_request_status(
        self, request_ids: Sequence[str], *, timeout: float | None = None
    ) -> tuple[RequestStatus, ...]:
        """The status of each create or return request asked for (at least one); ``values.status_for`` finds one.
        An id the provider does not know is a ``complete_with_error`` entry, not an error."""
        ...

    async def get_return_requests(
        self,
        machines: Sequence[MachineRef],
        *,
        tags: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[Reclaim, ...]:
        """Which of ``machines`` (every live one the caller knows) the provider wants back. Asked in chunks of
        ``paging.RECLAIM_CHUNK`` machines, each answer read page by page (``provider.paging``). ``tags`` (only for a
        plugin whose features say ``reclaims_by_tags``; ``contract.cluster_filter`` and more): also every machine
        carrying them that the provider wants back, asked with each chunk (one chunk, none named, when
        ``machines`` is empty)."""
        ...

    async def list_machines(
        self,
        tags: Mapping[str, str],
        *,
        timeout: float | None = None,
        expected: int = 0,
        sift: Sift | None = None,
    ) -> tuple[ListingRow, ...]:
        """Every live machine carrying all of ``tags`` (``contract.cluster_filter``, ``contract.op_filter``), read
        as rows (``ListingRow``; ``row.machine()`` is the ``ProviderMachine``) page by page (``provider.paging``: a
        ``PagingViolation`` for pages that do not join up). ``expected`` is about how many the caller expects: the
        cap on pages derives from it (``paging.max_pages``). ``sift``: given each page's rows, it returns those to
        keep (the orphan pass's ``orphan_reads.Sifter`` holds only ids for the others); a row dropped there is not
        joined with a later copy of its id, which the caller's sift sees as well."""
        ...


@runtime_checkable
class LicenseReader(Protocol):
    """A client that can read licence grants (``listLicenses``). Separate from ``ProviderReader`` because only a
    plugin whose ``describeProvider`` features say ``licensePools`` is ever asked; a client without the method is
    one that holds no pools (the orphan cycle checks ``isinstance(client, LicenseReader)`` and the feature)."""

    async def list_licenses(
        self, tags: Mapping[str, str], *, timeout: float | None = None, expected: int = 0
    ) -> tuple[LicenseGrant, ...]:
        """Every licence pool's grant to the cluster named in ``tags``, read page by page (``provider.paging``: a
        ``PagingViolation`` for pages that do not join up; a pool seen twice is kept once, the later copy)."""
        ...


@runtime_checkable
class LicenseClient(LicenseReader, Protocol):
    """A client that can also check licence units back in (``returnLicenses``), a mutation: only after the
    orphan cycle committed its record under a valid lease (``provisionerd.execution.orphan_licences``)."""

    async def return_licenses(self, request: LicenseReturn, *, timeout: float | None = None) -> RequestAccepted: ...


@runtime_checkable
class ProviderClient(ProviderReader, Protocol):
    """A provider, typed: the reads of ``ProviderReader`` plus the mutations. Every mutation must have passed the
    mutation gate (an acknowledged intent under a valid lease) before it is called: that is the caller's job."""

    async def request_machines(self, request: MachineRequest, *, timeout: float | None = None) -> RequestAccepted:
        """Create ``request.count`` machines; the same op_id again gives the same request, never new machines."""
        ...

    async def request_return_machines(
        self, request: MachineReturn, *, timeout: float | None = None
    ) -> RequestAccepted: ...

    async def stop_machines(self, request: MachineReturn, *, timeout: float | None = None) -> RequestAccepted:
        """Only for a provider whose features say ``stop_machines``; shaped like ``request_return_machines``."""
        ...

    async def aclose(self) -> None: ...


class PluginClient:
    """The ``ProviderClient`` over any ``PluginTransport``: writes each input document from its values, calls the
    transport (which checks it against the schema, and the output on arrival) and reads the output into values.

    ``transport`` is public for what only it can do: a persistent transport must be ``run`` in a nursery
    (``provisionerd.daemon.clients.supervise``)."""

    def __init__(
        self, transport: PluginTransport, *, page_size: int = LIST_PAGE_SIZE, reclaim_chunk: int = RECLAIM_CHUNK
    ) -> None:
        self.transport = transport
        self.page_size = page_size
        self.reclaim_chunk = reclaim_chunk
        # The legacy adapter is the one transport that knows more than its calls (its features, its journal).
        self._legacy = transport if isinstance(transport, LegacyProvider) else None
        self._pages = transport.list_page if isinstance(transport, PageTransport) else None

    def __repr__(self) -> str:
        return f"PluginClient({self.transport!r})"

    @property
    def name(self) -> str:
        return self.transport.name

    @property
    def legacy(self) -> bool:
        return self._legacy is not None

    @property
    def known_features(self) -> Features | None:
        return None if self._legacy is None else Features.from_mapping(self._legacy.features)

    def unknown_outcomes(self) -> tuple[UnknownOutcome, ...]:
        if self._legacy is None:
            return ()
        return tuple(UnknownOutcome.from_json(u) for u in self._legacy.unknown_outcomes())

    def calls_running(self) -> frozenset[str]:
        return frozenset() if self._legacy is None else frozenset(self._legacy.running_ops())

    # --- reads ---------------------------------------------------------------------------------------------------

    async def describe_provider(self, *, timeout: float | None = None) -> ProviderDescription:
        document = await self.transport.call("describeProvider", {}, timeout=timeout)
        return contract.read_description(self.name, document)

    async def get_available_templates(self, *, timeout: float | None = None) -> tuple[Offer, ...]:
        document = await self.transport.call("getAvailableTemplates", {}, timeout=timeout)
        return contract.read_offers(self.name, document)

    async def get_request_status(
        self, request_ids: Sequence[str], *, timeout: float | None = None
    ) -> tuple[RequestStatus, ...]:
        document = await self.transport.call("getRequestStatus", contract.status_input(request_ids), timeout=timeout)
        return contract.read_statuses(self.name, document)

    async def get_return_requests(
        self,
        machines: Sequence[MachineRef],
        *,
        tags: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[Reclaim, ...]:
        # The request side is chunked too: one line naming 100k machines would be ~8 MB. A plugin that answers
        # every reclaim whatever it is asked about gives the same ones per chunk: kept once (by name and id).
        action, size = "getReturnRequests", self.reclaim_chunk
        limit = max_pages(len(machines), size)
        joined: dict[tuple[str, str], Reclaim] = {}
        for start in range(0, max(len(machines), 1), size):
            chunk = contract.reclaims_input(machines[start : start + size], tags)
            join: PageJoin[Reclaim] = PageJoin(self.name, action, size, limit, lambda r: (r.name, r.machine_id))
            cursor: str | None = None
            while True:
                document = await self.transport.call(action, page_input(chunk, cursor, size), timeout=timeout)
                cursor = join.add(contract.read_reclaims(self.name, document), next_cursor(self.name, action, document))
                await trio.lowlevel.checkpoint()  # between pages, whatever the transport did
                if cursor is None:
                    break
            joined.update(((r.name, r.machine_id), r) for r in join.items)
        return tuple(joined.values())

    async def list_machines(
        self,
        tags: Mapping[str, str],
        *,
        timeout: float | None = None,
        expected: int = 0,
        sift: Sift | None = None,
    ) -> tuple[ListingRow, ...]:
        action, size = "listMachines", self.page_size
        join: PageJoin[ListingRow] = PageJoin(
            self.name, action, size, max_pages(expected, size), attrgetter("machine_id")
        )
        first, cursor = contract.listing_input(tags), None
        while True:
            request = page_input(first, cursor, size)
            if self._pages is not None:
                answer = await self._pages(request, timeout=timeout)
            else:
                answer = await self.transport.call(action, request, timeout=timeout)
            if isinstance(answer, ListingPage):  # read already, as its types checked it
                await trio.lowlevel.checkpoint()
                rows, after = answer.machines, answer.nextCursor
            else:
                rows = await self._read_machines(answer)
                after = next_cursor(self.name, action, answer)
            cursor = join.add(rows, after) if sift is None else join.add(sift(rows), after, size=len(rows))
            if cursor is None:
                return join.items

    async def list_licenses(
        self, tags: Mapping[str, str], *, timeout: float | None = None, expected: int = 0
    ) -> tuple[LicenseGrant, ...]:
        action, size = "listLicenses", self.page_size
        join: PageJoin[LicenseGrant] = PageJoin(self.name, action, size, max_pages(expected, size), lambda g: g.pool)
        first, cursor = contract.licenses_input(tags), None
        while True:
            document = await self.transport.call(action, page_input(first, cursor, size), timeout=timeout)
            cursor = join.add(contract.read_licenses(self.name, document), next_cursor(self.name, action, document))
            await trio.lowlevel.checkpoint()  # between pages, whatever the transport did
            if cursor is None:
                return join.items

    async def _read_machines(self, document: Mapping[str, Any]) -> list[ListingRow]:
        """The machines of one validated ``listMachines`` page, read ``READ_SLICE`` at a time with a checkpoint
        before each: the transport's validation of the page was one stretch of the loop, reading it is never
        more than a slice (an older plugin's single page of 20,000 machines included)."""
        entries = document.get("machines")
        if not isinstance(entries, list):
            return list(contract.read_machines(self.name, document))  # its error
        machines: list[ListingRow] = []
        for start in range(0, len(entries), READ_SLICE):
            await trio.lowlevel.checkpoint()
            machines.extend(contract.read_machines(self.name, {"machines": entries[start : start + READ_SLICE]}))
        await trio.lowlevel.checkpoint()
        return machines

    # --- mutations -----------------------------------------------------------------------------------------------

    async def request_machines(self, request: MachineRequest, *, timeout: float | None = None) -> RequestAccepted:
        document = await self.transport.call("requestMachines", contract.request_input(request), timeout=timeout)
        return contract.read_accepted(self.name, "requestMachines", document)

    async def request_return_machines(self, request: MachineReturn, *, timeout: float | None = None) -> RequestAccepted:
        action = "requestReturnMachines"
        document = await self.transport.call(action, contract.return_input(request), timeout=timeout)
        return contract.read_accepted(self.name, action, document)

    async def stop_machines(self, request: MachineReturn, *, timeout: float | None = None) -> RequestAccepted:
        document = await self.transport.call("stopMachines", contract.return_input(request), timeout=timeout)
        return contract.read_accepted(self.name, "stopMachines", document)

    async def return_licenses(self, request: LicenseReturn, *, timeout: float | None = None) -> RequestAccepted:
        action = "returnLicenses"
        document = await self.transport.call(action, contract.license_return_input(request), timeout=timeout)
        return contract.read_accepted(self.name, action, document)

    async def aclose(self) -> None:
        await self.transport.aclose()
