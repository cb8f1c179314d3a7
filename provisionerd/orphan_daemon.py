"""The orphan cycles inside the daemon, and the read-only provider client the dry-run report reads through.

``run_orphan_cycles(core, clients, executor)`` starts one :class:`~provisionerd.orphan_cycle.OrphanCycle` per
configured provider that has a client, each reading the daemon's own session (``core.session``) and lease keeper
(``core.keepers[name]``) and acting only through ``executor``. The cycles share nothing but the events log.

``ReadOnlyClient`` wraps a ``ProviderClient`` and refuses every mutating action before it reaches the plugin: the
dry-run report reads through it, so "it changes nothing" is enforced, not just intended, and its call log backs
the report's ``mutations`` count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from provisionerd.config import Config, ProviderConfig
from provisionerd.errors import ProviderUnsupported
from provisionerd.events import EventLog
from provisionerd.lease import LeaseKeeper
from provisionerd.orphan_cycle import OrphanCycle, OrphanExecutor
from provisionerd.orphan_policy import OrphanPolicy
from provisionerd.orphan_reads import READ_ONLY_ACTIONS, SettleTracker, read_keeper, read_session
from provisionerd.provider.runtime import ProviderClient
from provisionerd.session import ControllerSession


@attrs.define(eq=False)
class ReadOnlyClient:
    """A ``ProviderClient`` that passes read-only actions to ``inner`` and refuses every other one before it
    reaches the plugin (``ProviderUnsupported``). ``calls`` logs every action asked for, refused or not."""

    inner: ProviderClient
    calls: list[str] = attrs.field(factory=list)

    @property
    def name(self) -> str:
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

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        self.calls.append(action)
        if action not in READ_ONLY_ACTIONS:
            raise ProviderUnsupported(self.name, action, "refused: this command calls read-only actions only")
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()


def policy_of(provider: ProviderConfig, *, dry_run: bool = False) -> OrphanPolicy:
    """The provider's orphan policy (``ConfigError`` if a knob is invalid); ``dry_run`` forces dry run on."""
    policy = OrphanPolicy.from_provider_config(provider)
    return attrs.evolve(policy, dry_run=True) if dry_run else policy


def build_cycles(
    config: Config,
    session: ControllerSession,
    keepers: Mapping[str, LeaseKeeper],
    clients: Mapping[str, ProviderClient],
    executor: OrphanExecutor,
    events: EventLog,
    *,
    wall_clock: Callable[[], float] = time.time,
) -> dict[str, tuple[OrphanCycle, float]]:
    """One cycle (and its interval) per configured provider that has a client and a keeper."""
    cycles: dict[str, tuple[OrphanCycle, float]] = {}
    for provider in config.providers:
        if provider.name not in clients or provider.name not in keepers:
            continue
        tracker = SettleTracker(provider.orphans.settle)
        session.on_resync.append(lambda view, tracker=tracker: tracker.joined(view.generation))
        keeper = keepers[provider.name]
        cycle = OrphanCycle(
            cluster=config.cluster,
            identity=config.identity,
            provider=provider.name,
            policy=policy_of(provider),
            client=clients[provider.name],
            read_controller=lambda tracker=tracker, name=provider.name: read_session(session, tracker, name),
            read_lease=lambda keeper=keeper: read_keeper(keeper),
            executor=executor,
            events=events,
            wall_clock=wall_clock,
            list_timeout=provider.timeouts.for_action("listMachines"),
        )
        cycles[provider.name] = (cycle, provider.orphans.interval)
    return cycles


async def run_orphan_cycles(
    core: Any,
    clients: Mapping[str, ProviderClient],
    executor: OrphanExecutor,
    *,
    wall_clock: Callable[[], float] | None = None,
    task_status: trio.TaskStatus[dict[str, OrphanCycle]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a cycle per provider of ``core`` (a ``DaemonCore``) until cancelled; hands the cycles to
    ``task_status`` (for status and tests). ``wall_clock`` defaults to ``core.wall``."""
    wall = wall_clock if wall_clock is not None else getattr(core, "wall", time.time)
    cycles = build_cycles(core.config, core.session, core.keepers, clients, executor, core.events,
                          wall_clock=wall)  # fmt: skip
    async with trio.open_nursery() as nursery:
        for cycle, interval in cycles.values():
            await nursery.start(cycle.run, interval)
        task_status.started({name: cycle for name, (cycle, _) in cycles.items()})
