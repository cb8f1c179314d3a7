"""The provider clients the config names, the block that runs them for a command, and the read-only wrapper.

``provider_clients(config)`` builds one typed ``PluginClient`` per configured provider over the transport the
daemon serves it with (``provider_transport``: a persistent plugin, a one-shot plugin, or a one-shot plugin behind
the legacy LSF adapter); ``DaemonCore`` supervises the persistent transports in its own nursery (``supervise``).
A command that talks to the plugins without a daemon (``provisionerd orphans``) opens the same clients with
``open_clients``, which supervises them until its block exits.

``ReadOnlyClient`` is a ``ProviderReader`` over a provider's client: it has the read-only actions and nothing else,
so code given it cannot ask for a mutation at all. The dry runs read through it, so "it changes nothing" holds by
construction, not just by intent, and its call log backs the report's ``calls`` and ``mutations``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence

import attrs
import trio

from provisionerd.config.loader import ACTION_TIMEOUT_KEYS, Config, ProviderConfig
from provisionerd.controller.memory_file import state_dir_of
from provisionerd.daemon.metered import unwrap
from provisionerd.domain.errors import ProviderUnsupported
from provisionerd.domain.model import Offer
from provisionerd.provider import runtime
from provisionerd.provider.client import LicenseReader, PluginClient, ProviderClient, ProviderReader, Sift
from provisionerd.provider.legacy.wiring import client_for, legacy_settings
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import PersistentProvider
from provisionerd.provider.runtime import PluginTransport
from provisionerd.provider.values import (
    Features,
    LicenseGrant,
    ListingRow,
    MachineRef,
    ProviderDescription,
    Reclaim,
    RequestStatus,
    UnknownOutcome,
)


def runtime_config(config: Config, provider: ProviderConfig) -> runtime.ProviderConfig:
    """The plugin runtime's view of one configured provider (its ``env`` values are credentials: redacted)."""
    if provider.transport == "persistent":
        command = provider.command
        path = command[0] if command else ""
        if not provider.argv and provider.path is not None and provider.path.is_dir():
            path = str(provider.path / "provider")
        args = tuple(command[1:])
    else:
        path, args = str(provider.path or ""), ()
    state = state_dir_of(config)  # one-shot calls outlive the daemon there (provider.calls)
    return runtime.ProviderConfig(
        name=provider.name,
        cluster=config.cluster,
        path=path,
        transport=provider.transport,
        args=args,
        conf_dir=str(provider.conf_dir or ""),
        data_dir=str(provider.data_dir or ""),
        calls_dir="" if state is None else str(state / "calls" / provider.name),
        credentials=dict(provider.env),
        timeouts={action: provider.timeouts.for_action(action) for action in ACTION_TIMEOUT_KEYS},
    )


def provider_transport(config: Config, provider: ProviderConfig) -> PluginTransport:
    """The transport of one configured provider. A one-shot plugin runs through the legacy LSF adapter
    when ``[providers.legacy] mode`` is ``true``, or ``"auto"`` (the default) and its directory lacks our
    extension scripts (``describeProvider.sh``/``listMachines.sh``); ``false`` never. ``ConfigError`` for bad
    legacy settings."""
    rc = runtime_config(config, provider)
    if provider.transport == "persistent":
        return PersistentProvider(rc)
    runner = OneShotProvider(rc)
    mode = provider.legacy.mode
    if mode == "off":
        return runner
    settings = legacy_settings(provider.legacy.settings_table(), f"providers[{provider.name}].legacy")
    transport: PluginTransport = client_for(runner, settings, force=mode == "on")
    return transport


def provider_clients(config: Config) -> dict[str, ProviderClient]:
    """One typed client per configured provider (persistent transports must be ``supervise``d in a nursery)."""
    return {provider.name: PluginClient(provider_transport(config, provider)) for provider in config.providers}


async def supervise(nursery: trio.Nursery, clients: Mapping[str, ProviderClient]) -> None:
    """Start the supervisor of every persistent plugin among ``clients`` in ``nursery`` (a one-shot plugin has
    nothing to supervise: each call is its own process)."""
    for client in map(unwrap, clients.values()):
        if isinstance(client, PluginClient) and isinstance(client.transport, PersistentProvider):
            await nursery.start(client.transport.run)


@contextlib.asynccontextmanager
async def open_clients(config: Config, names: Sequence[str]) -> AsyncIterator[dict[str, ProviderClient]]:
    """The daemon's own provider clients for ``names`` (persistent plugins supervised until the block exits)."""
    clients = {name: client for name, client in provider_clients(config).items() if name in names}
    async with trio.open_nursery() as nursery:
        await supervise(nursery, clients)
        try:
            yield clients
        finally:
            for client in clients.values():
                await client.aclose()
            nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class ReadOnlyClient:
    """A ``ProviderReader`` over ``inner``: the read-only actions pass through, and there is no method for any
    other. ``calls`` logs every action asked for."""

    inner: ProviderReader
    calls: list[str] = attrs.field(factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def legacy(self) -> bool:
        return self.inner.legacy

    @property
    def known_features(self) -> Features | None:
        """The inner client's features known without a call, if any (the legacy adapter's)."""
        return self.inner.known_features

    def unknown_outcomes(self) -> tuple[UnknownOutcome, ...]:
        return self.inner.unknown_outcomes()

    def calls_running(self) -> frozenset[str]:
        return self.inner.calls_running()

    @property
    def mutations(self) -> int:
        """Mutating calls that reached the plugin: none, by construction (counted, so the report states it)."""
        return 0

    async def describe_provider(self, *, timeout: float | None = None) -> ProviderDescription:  # noqa: ASYNC109
        self.calls.append("describeProvider")
        return await self.inner.describe_provider(timeout=timeout)

    async def get_available_templates(self, *, timeout: float | None = None) -> tuple[Offer, ...]:  # noqa: ASYNC109
        self.calls.append("getAvailableTemplates")
        return await self.inner.get_available_templates(timeout=timeout)

    async def get_request_status(
        self,
        request_ids: Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> tuple[RequestStatus, ...]:
        self.calls.append("getRequestStatus")
        return await self.inner.get_request_status(request_ids, timeout=timeout)

    async def get_return_requests(
        self,
        machines: Sequence[MachineRef],
        *,
        tags: Mapping[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> tuple[Reclaim, ...]:
        self.calls.append("getReturnRequests")
        return await self.inner.get_return_requests(machines, tags=tags, timeout=timeout)

    async def list_machines(
        self,
        tags: Mapping[str, str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        expected: int = 0,
        sift: Sift | None = None,
    ) -> tuple[ListingRow, ...]:
        self.calls.append("listMachines")
        return await self.inner.list_machines(tags, timeout=timeout, expected=expected, sift=sift)

    async def list_licenses(
        self,
        tags: Mapping[str, str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        expected: int = 0,
    ) -> tuple[LicenseGrant, ...]:
        self.calls.append("listLicenses")
        inner = self.inner
        if not isinstance(inner, LicenseReader):
            raise ProviderUnsupported(self.name, "listLicenses", "this client holds no licence pools")
        return await inner.list_licenses(tags, timeout=timeout, expected=expected)
