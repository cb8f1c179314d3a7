"""The orphan cycles inside the daemon, and the read-only provider client the dry-run report reads through.

``run_orphan_cycles(core, clients, executor)`` starts one :class:`~provisionerd.orphan_cycle.OrphanCycle` per
configured provider that has a client, each reading the daemon's own session (``core.session``) and lease keeper
(``core.keepers[name]``) and acting only through ``executor``. The cycles share nothing but the events log.

``OrphanActions`` answers the admin socket's ``orphan_action`` command (``provisionerd orphans adopt|return``
while the daemon runs): the admin's explicit action, decided and carried out by
``provisionerd.orphans_admin.decide_and_act`` with the daemon's own session view, lease keeper and executor (so
through the daemon's gate, under its epoch, intent first) and audited in the daemon's events log. One action at a
time per machine (a second request for it is answered ``busy``) and at most ``max_running`` at once. Each action
runs in the daemon's own nursery, not in the socket request: a client that gives up, or a request that outlives
its bound (``orphans_admin.action_timeout``: the socket then answers ``pending``), never cuts a provider call or
a return short; it finishes and is audited.

``ReadOnlyClient`` is a ``ProviderReader`` over a provider's client (or its bare transport): it has the read-only
actions and nothing else, so code given it cannot ask for a mutation at all. The dry-run report reads through it,
so "it changes nothing" holds by construction, not just by intent, and its call log backs the report's
``calls`` and ``mutations``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from provisionerd.config.loader import Config, ProviderConfig
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.session import ControllerSession
from provisionerd.daemon.admin_socket import Command
from provisionerd.daemon.orphan_admin import Actor, AdminRequest, AdminResult, action_timeout, decide_and_act
from provisionerd.domain.errors import ProtocolError
from provisionerd.domain.model import Offer, ProviderMachine
from provisionerd.execution.orphan_cycle import OrphanCycle, OrphanExecutor
from provisionerd.execution.orphan_reads import SettleTracker, read_keeper, read_session
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.provider.client import ProviderReader, as_reader
from provisionerd.provider.runtime import ProviderClient
from provisionerd.provider.values import (
    Features,
    MachineRef,
    ProviderDescription,
    Reclaim,
    RequestStatus,
    UnknownOutcome,
)
from provisionerd.telemetry.events import EventLog


@attrs.define(eq=False)
class ReadOnlyClient:
    """A ``ProviderReader`` over ``inner`` (a typed client; a bare transport is wrapped in ``PluginClient``): the
    read-only actions pass through, and there is no method for any other. ``calls`` logs every action asked for."""

    inner: ProviderReader = attrs.field(converter=as_reader)
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
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> tuple[Reclaim, ...]:
        self.calls.append("getReturnRequests")
        return await self.inner.get_return_requests(machines, timeout=timeout)

    async def list_machines(
        self,
        tags: Mapping[str, str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> tuple[ProviderMachine, ...]:
        self.calls.append("listMachines")
        return await self.inner.list_machines(tags, timeout=timeout)


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
    cycles = build_cycles(core.config, core.session, core.keepers, clients, executor, core.events, wall_clock=wall)
    async with trio.open_nursery() as nursery:
        for cycle, interval in cycles.values():
            await nursery.start(cycle.run, interval)
        task_status.started({name: cycle for name, (cycle, _) in cycles.items()})


class DaemonParts(Protocol):
    """What the orphan side of the daemon uses of ``DaemonCore``: its config, session, lease keepers, provider
    clients, executor (every mutation through the gate), events log and wall clock."""

    config: Config
    session: ControllerSession
    keepers: Mapping[str, LeaseKeeper]
    providers: Mapping[str, ProviderClient]
    executor: OrphanExecutor
    events: EventLog
    wall: Callable[[], float]


class OrphanActions:
    """The daemon's side of ``provisionerd orphans adopt|return`` (see the module docstring). ``run`` it in the
    daemon's nursery; hand ``command`` to the admin socket as ``orphan_action``."""

    def __init__(self, core: DaemonParts, *, max_running: int = 4) -> None:
        self._core = core
        self._max_running = max_running
        self._nursery: trio.Nursery | None = None
        self.running: set[tuple[str, str]] = set()  # (provider, machine_id) of each action under way

    @property
    def command(self) -> Command:
        return Command(self.handle, self.timeout_for)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the actions run in, until cancelled (which cancels any action under way)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def timeout_for(self, request: Mapping[str, Any]) -> float:
        """The socket's bound for ``request``: ``action_timeout`` of its provider (a bad request answers at once)."""
        provider = request.get("provider")
        if isinstance(provider, str) and provider in self._core.config.provider_names:
            return action_timeout(self._core.config, provider)
        return 5.0

    async def handle(self, document: dict[str, Any], peer_uid: int | None = None) -> dict[str, Any]:
        """Answer one ``orphan_action`` request: ``{"ok", "result": AdminResult}`` when decided (and done),
        ``{"ok": false, "error"}`` for a bad request, ``{"ok": false, "busy": true, "error"}`` while that machine
        (or ``max_running`` machines) has an action under way."""
        try:
            request = AdminRequest.from_json(document)
        except ProtocolError as exc:
            return {"ok": False, "error": str(exc)}
        core = self._core
        if request.provider not in core.providers or request.provider not in core.keepers:
            return {"ok": False, "error": f"this daemon has no provider named {request.provider!r}"}
        key = (request.provider, request.machine_id)
        if key in self.running:
            return {
                "ok": False,
                "busy": True,
                "error": f"busy: an action on machine {request.machine_id!r} of "
                f"provider {request.provider!r} is under way; try again",
            }
        if len(self.running) >= self._max_running:
            return {"ok": False, "busy": True, "error": f"busy: {len(self.running)} orphan actions are under way"}
        if self._nursery is None:
            return {"ok": False, "error": "the daemon is not ready for orphan actions (starting or stopping)"}
        keeper = core.keepers[request.provider]
        actor = Actor(
            identity=core.config.identity,
            via="daemon",
            client=core.providers[request.provider],
            # The view must be resynced after our lease grant (read_session); the admin overrides "settling".
            read_controller=lambda: read_session(core.session, SettleTracker(0.0), request.provider),
            read_lease=lambda: read_keeper(keeper),
            executor=core.executor,
            events=core.events,
            wall_clock=core.wall,
            witness={} if peer_uid is None else {"uid": peer_uid},
        )
        done = trio.Event()
        box: list[AdminResult] = []

        async def one() -> None:
            try:
                box.append(await decide_and_act(core.config, request, actor))
            finally:
                self.running.discard(key)
                done.set()

        self.running.add(key)
        self._nursery.start_soon(one)
        await done.wait()
        if not box:  # cancelled: the daemon is stopping
            return {"ok": False, "error": "the daemon stopped before the action finished"}
        return {"ok": box[0].ok, "result": box[0].to_json()}
