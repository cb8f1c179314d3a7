"""The one place in the call path that sees every provider call end: ``MeteredClient`` around each provider client.

``metered(clients, calls)`` wraps each ``ProviderClient`` so that every call, whoever makes it (the executor, the
offer feed and its probes, the reclaim poll, the orphan cycles), ends in ``CallLog.ended(provider, action,
outcome, seconds)``: the outcome is ``ok``, the refusal's contract code (``throttled``, ``auth_failed``, ...) or the
kind of unknown outcome (``timeout``, ``crashed``, ``protocol_violation``, ``outcome_unknown``), ``unsupported``,
``error`` for anything else, or ``cancelled``; the duration is on trio's clock. The wrapper changes nothing else:
values and errors pass through unchanged.

``CallLog`` keeps the last call per provider (for ``provisionerd status``: the last call's action, outcome and age,
and the access and connectivity checks) and counts each call in its counters (``telemetry.metrics.CallCounters``:
the Prometheus counter and histogram).
"""

# ruff: noqa: ASYNC109

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import trio

from provisionerd.domain.errors import (
    OutcomeUnknown,
    ProviderCrashed,
    ProviderError,
    ProviderOutcomeUnknown,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnsupported,
)
from provisionerd.domain.model import Offer
from provisionerd.provider.client import LicenseClient, LicenseReader, ProviderClient, Sift
from provisionerd.provider.values import (
    Features,
    LicenseGrant,
    LicenseReturn,
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
from provisionerd.telemetry.metrics import CallCounters

T = TypeVar("T")

#: Outcomes that mean the plugin did not answer (connectivity); a refusal code means it answered.
NO_ANSWER = frozenset({"timeout", "crashed", "protocol_violation", "error"})


def outcome_of(exc: BaseException | None) -> str:
    """The bounded outcome label of a call that raised ``exc`` (``None``: it returned)."""
    if exc is None:
        return "ok"
    if isinstance(exc, ProviderRejected):
        return exc.code
    for cls, name in (
        (ProviderTimeout, "timeout"),
        (ProviderCrashed, "crashed"),
        (ProviderProtocolViolation, "protocol_violation"),
        (ProviderOutcomeUnknown, "outcome_unknown"),
        (OutcomeUnknown, "outcome_unknown"),
        (ProviderUnsupported, "unsupported"),
    ):
        if isinstance(exc, cls):
            return name
    if isinstance(exc, trio.Cancelled):
        return "cancelled"
    return "error"


@attrs.frozen
class CallRecord:
    """How one provider call ended: ``at`` is trio's clock at its end."""

    action: str
    outcome: str
    at: float
    seconds: float
    detail: str = ""  # the provider error's message (the plugin's words; never credentials: the runtime redacts)


@attrs.define(eq=False)
class CallLog:
    """The last call per provider, and the counters every call feeds (``counters``: the calls counter and latency
    histogram the daemon's registry exports). ``last_ok`` / ``last_answer``: the last call that succeeded / that
    the plugin answered at all."""

    last: dict[str, CallRecord] = attrs.field(factory=dict)
    last_ok: dict[str, CallRecord] = attrs.field(factory=dict)
    last_answer: dict[str, CallRecord] = attrs.field(factory=dict)
    counters: CallCounters = attrs.field(factory=CallCounters)

    def ended(self, provider: str, action: str, outcome: str, seconds: float, detail: str = "") -> None:
        record = CallRecord(action, outcome, trio.current_time(), seconds, detail[:200])
        if outcome != "cancelled":  # a call cancelled by its caller says nothing about the provider
            self.last[provider] = record
            if outcome == "ok":
                self.last_ok[provider] = record
            if outcome not in NO_ANSWER:
                self.last_answer[provider] = record
        self.counters.ended(provider, action, outcome, seconds)


class MeteredClient:
    """A ``ProviderClient`` that reports every call's end to a ``CallLog`` (see the module docstring)."""

    def __init__(self, inner: ProviderClient, calls: CallLog) -> None:
        self.inner = inner
        self._calls = calls

    def __repr__(self) -> str:
        return f"MeteredClient({self.inner!r})"

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def legacy(self) -> bool:
        return self.inner.legacy

    @property
    def known_features(self) -> Features | None:
        return self.inner.known_features

    def unknown_outcomes(self) -> tuple[UnknownOutcome, ...]:
        return self.inner.unknown_outcomes()

    def calls_running(self) -> frozenset[str]:
        return self.inner.calls_running()

    async def _timed(self, action: str, call: Callable[[], Awaitable[T]]) -> T:
        started = trio.current_time()
        try:
            result = await call()
        except BaseException as exc:
            detail = exc.detail if isinstance(exc, ProviderError) else ""
            self._calls.ended(self.name, action, outcome_of(exc), trio.current_time() - started, detail)
            raise
        self._calls.ended(self.name, action, "ok", trio.current_time() - started)
        return result

    async def describe_provider(self, *, timeout: float | None = None) -> ProviderDescription:
        return await self._timed("describeProvider", lambda: self.inner.describe_provider(timeout=timeout))

    async def get_available_templates(self, *, timeout: float | None = None) -> tuple[Offer, ...]:
        return await self._timed("getAvailableTemplates", lambda: self.inner.get_available_templates(timeout=timeout))

    async def get_request_status(
        self, request_ids: Sequence[str], *, timeout: float | None = None
    ) -> tuple[RequestStatus, ...]:
        return await self._timed(
            "getRequestStatus", lambda: self.inner.get_request_status(request_ids, timeout=timeout)
        )

    async def get_return_requests(
        self, machines: Sequence[MachineRef], *, tags: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> tuple[Reclaim, ...]:
        return await self._timed(
            "getReturnRequests", lambda: self.inner.get_return_requests(machines, tags=tags, timeout=timeout)
        )

    async def list_machines(
        self, tags: Mapping[str, str], *, timeout: float | None = None, expected: int = 0, sift: Sift | None = None
    ) -> tuple[ListingRow, ...]:
        return await self._timed(
            "listMachines", lambda: self.inner.list_machines(tags, timeout=timeout, expected=expected, sift=sift)
        )

    async def request_machines(self, request: MachineRequest, *, timeout: float | None = None) -> RequestAccepted:
        return await self._timed("requestMachines", lambda: self.inner.request_machines(request, timeout=timeout))

    async def request_return_machines(self, request: MachineReturn, *, timeout: float | None = None) -> RequestAccepted:
        return await self._timed(
            "requestReturnMachines", lambda: self.inner.request_return_machines(request, timeout=timeout)
        )

    async def stop_machines(self, request: MachineReturn, *, timeout: float | None = None) -> RequestAccepted:
        return await self._timed("stopMachines", lambda: self.inner.stop_machines(request, timeout=timeout))

    async def list_licenses(
        self, tags: Mapping[str, str], *, timeout: float | None = None, expected: int = 0
    ) -> tuple[LicenseGrant, ...]:
        inner = self.inner
        if not isinstance(inner, LicenseReader):
            raise ProviderUnsupported(self.name, "listLicenses", "this client holds no licence pools")
        return await self._timed("listLicenses", lambda: inner.list_licenses(tags, timeout=timeout, expected=expected))

    async def return_licenses(self, request: LicenseReturn, *, timeout: float | None = None) -> RequestAccepted:
        inner = self.inner
        if not isinstance(inner, LicenseClient):
            raise ProviderUnsupported(self.name, "returnLicenses", "this client holds no licence pools")
        return await self._timed("returnLicenses", lambda: inner.return_licenses(request, timeout=timeout))

    async def aclose(self) -> None:
        await self.inner.aclose()


def metered(clients: Mapping[str, ProviderClient], calls: CallLog) -> dict[str, ProviderClient]:
    """Each client wrapped in a ``MeteredClient`` reporting to ``calls`` (one already wrapped is kept)."""
    return {name: c if isinstance(c, MeteredClient) else MeteredClient(c, calls) for name, c in clients.items()}


def unwrap(client: Any) -> Any:
    """The client a ``MeteredClient`` wraps (any other client as it is): what ``supervise`` looks into."""
    return client.inner if isinstance(client, MeteredClient) else client
