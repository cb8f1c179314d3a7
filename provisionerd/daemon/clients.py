"""The provider clients the config names, the block that runs them for a command, and the read-only wrapper.

``provider_clients(config)`` builds one ``ProviderClient`` per configured provider, the way the daemon serves it
(``provider_client``: a persistent plugin, a one-shot plugin, or a one-shot plugin behind the legacy LSF adapter);
``DaemonCore`` supervises the persistent ones in its own nursery. A command that talks to the plugins without a
daemon (``provisionerd orphans``) opens the same clients with ``open_clients``, which supervises them until its
block exits.

``ReadOnlyClient`` wraps a ``ProviderClient`` and refuses every mutating action before it reaches the plugin: the
dry runs read through it, so "it changes nothing" is enforced, not just intended, and its call log backs the
report's ``mutations`` count.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.config.loader import ACTION_TIMEOUT_KEYS, Config, ProviderConfig
from provisionerd.domain.errors import ProviderUnsupported
from provisionerd.execution.orphan_reads import READ_ONLY_ACTIONS
from provisionerd.provider import runtime
from provisionerd.provider.legacy.wiring import client_for, legacy_settings
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import PersistentProvider
from provisionerd.provider.runtime import ProviderClient


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
    return runtime.ProviderConfig(
        name=provider.name,
        cluster=config.cluster,
        path=path,
        transport=provider.transport,
        args=args,
        conf_dir=str(provider.conf_dir or ""),
        data_dir=str(provider.data_dir or ""),
        credentials=dict(provider.env),
        timeouts={action: provider.timeouts.for_action(action) for action in ACTION_TIMEOUT_KEYS},
    )


def provider_client(config: Config, provider: ProviderConfig) -> ProviderClient:
    """The ``ProviderClient`` of one configured provider. A one-shot plugin runs through the legacy LSF adapter
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
    client: ProviderClient = client_for(runner, settings, force=mode == "on")
    return client


def provider_clients(config: Config) -> dict[str, ProviderClient]:
    """One ``ProviderClient`` per configured provider (persistent ones must be ``run`` in a nursery)."""
    return {provider.name: provider_client(config, provider) for provider in config.providers}


@contextlib.asynccontextmanager
async def open_clients(config: Config, names: Sequence[str]) -> AsyncIterator[dict[str, ProviderClient]]:
    """The daemon's own provider clients for ``names`` (persistent plugins supervised until the block exits)."""
    clients = {name: client for name, client in provider_clients(config).items() if name in names}
    async with trio.open_nursery() as nursery:
        for client in clients.values():
            if isinstance(client, PersistentProvider):
                await nursery.start(client.run)
        try:
            yield clients
        finally:
            for client in clients.values():
                await client.aclose()
            nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class ReadOnlyClient:
    """A ``ProviderClient`` that passes read-only actions to ``inner`` and refuses every other one before it
    reaches the plugin (``ProviderUnsupported``). ``calls`` logs every action asked for, refused or not."""

    inner: ProviderClient
    calls: list[str] = attrs.field(factory=list)
    name: str = attrs.field(init=False)

    @name.default
    def _inner_name(self) -> str:
        return self.inner.name

    @property
    def features(self) -> Mapping[str, bool] | None:
        """The inner client's own feature record, if it keeps one (the legacy adapter does)."""
        return getattr(self.inner, "features", None)

    def unknown_outcomes(self) -> list[dict[str, Any]]:
        read = getattr(self.inner, "unknown_outcomes", None)
        return list(read()) if callable(read) else []

    @property
    def mutations(self) -> int:
        """Mutating calls that reached the plugin: none, by construction (counted, so the report states it)."""
        return 0

    @property
    def refused(self) -> int:
        return sum(1 for action in self.calls if action not in READ_ONLY_ACTIONS)

    async def call(
        self,
        action: str,
        input: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the ProviderClient protocol's signature
    ) -> dict[str, Any]:
        self.calls.append(action)
        if action not in READ_ONLY_ACTIONS:
            raise ProviderUnsupported(self.name, action, "refused: this command calls read-only actions only")
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()
