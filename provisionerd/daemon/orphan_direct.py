"""``provisionerd orphans adopt|return`` outside the daemon: ask the running one, or act with pieces of our own.

``via_daemon(config, request)`` asks the daemon listening on the config's admin socket to decide and act
(``daemon.orphans.OrphanActions`` answers); ``None`` means no daemon listens there, and only then may the caller
act itself with ``act``. ``act`` is the **direct path**: it builds its session, lease keeper, gate and executor
with the daemon's own builder (``daemon.builder.build_pieces``, so with the settings the daemon derives from the
same config), as its own identity (``<identity>-orphans-admin``), takes the provider's lease, waits for a view
resynced after the grant (as the daemon does before it acts on a provider), runs the same decision
(``daemon.orphan_admin.decide_and_act``) and gives the lease back. A direct ``--dry-run`` joins without a lease,
reads through a ``ReadOnlyClient`` and has no executor at all.

``read_controller_once`` is the one read of the controller's view without a lease that the direct dry run and the
dry-run report (``daemon.orphan_report``) share.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import trio

from provisionerd.config.loader import Config
from provisionerd.controller.session_settings import LinkState, StreamFactory
from provisionerd.daemon.admin_socket import request as socket_request
from provisionerd.daemon.builder import build_pieces, build_session
from provisionerd.daemon.clients import ReadOnlyClient, open_clients
from provisionerd.daemon.orphan_admin import (
    Actor,
    AdminRequest,
    AdminResult,
    action_timeout,
    current_user,
    decide_and_act,
    side_identity,
)
from provisionerd.execution.orphan_reads import ControllerRead
from provisionerd.orphans.model import ControllerState, LeaseState, Unreadable
from provisionerd.provider.client import ProviderClient
from provisionerd.telemetry.events import EventLog

#: How long ``via_socket`` waits without a config to say the action's bound (the daemon answers "pending" first).
SOCKET_WAIT = 120.0


def via_daemon(config: Config, request: AdminRequest) -> AdminResult | None:
    """Ask the running daemon (blocking); ``None`` when none listens on the config's admin socket (no socket
    configured, no socket file, or the connection refused), so the caller may act directly. Any other failure is
    a result (not ok) and must not lead to acting directly."""
    path = config.daemon.admin_socket
    if path is None:
        return None
    return via_socket(path, request, action_timeout(config, request.provider) + 5.0)


def via_socket(path: Path, request: AdminRequest, wait: float = SOCKET_WAIT) -> AdminResult | None:
    """``via_daemon`` on the admin socket ``path`` (``None``: no daemon listens there)."""
    try:
        reply = socket_request(path, request.to_json(), timeout=wait)
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    except (OSError, ValueError) as exc:
        return AdminResult(
            False,
            f"cannot use the daemon's admin socket {path}: {exc}; not acting directly, as the "
            "daemon may be running (it may hold the lease or be acting)",
            via="daemon",
        )
    if "result" in reply:
        try:
            return AdminResult.from_json(reply["result"])
        except (TypeError, ValueError) as exc:
            return AdminResult(False, f"the daemon's answer is malformed: {exc}", via="daemon")
    error = str(reply.get("error") or "no result")
    return AdminResult(
        False,
        f"the daemon answered: {error}",
        via="daemon",
        outcome="busy" if reply.get("busy") else "pending" if reply.get("pending") else "",
    )


async def read_controller_once(
    config: Config,
    connect: StreamFactory,
    timeout: float,  # noqa: ASYNC109 - a bound on the wait, after which the view is reported unreadable
    *,
    identity: str,
) -> ControllerRead:
    """Join the controller as ``identity``, wait for the resync, and return the view (no lease, no commit).
    Joined means joined to the primary (a standby redirects); the view is taken as settled: the settle window is
    the running daemon's own, which a command cannot see."""
    session = build_session(config, connect, EventLog(), random.Random(), identity=identity)
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        with trio.move_on_after(timeout):
            await session.wait_ready()
        view = session.view
        up = session.state is LinkState.UP and view is not None
        reason = session.last_error or f"no primary answered within {timeout:g}s"
        nursery.cancel_scope.cancel()
    if not up or view is None:
        return ControllerRead(Unreadable(reason))
    state = ControllerState(primary=True, settled=True)
    return ControllerRead(view.facts, tuple(view.hosts.values()), state, demand=view.demand)


async def act(
    config: Config,
    kind: str,
    provider: str,
    machine_id: str,
    *,
    client: ProviderClient,
    connect: StreamFactory,
    timeout: float = 30.0,  # noqa: ASYNC109 - bounds the wait for the lease and the view, never the action
    events: EventLog | None = None,
    wall_clock: Callable[[], float] = time.time,
    user: str | None = None,
    dry_run: bool = False,
) -> AdminResult:
    """The direct path (see the module docstring): the command's own lease, gate and executor, built as the
    daemon builds its own. ``timeout`` bounds the wait for the lease and for a view resynced after the grant;
    the action itself, once decided, is never cut short."""
    events = events if events is not None else EventLog()
    request = AdminRequest(kind, provider, machine_id, current_user() if user is None else user, dry_run)
    identity = side_identity(config.identity, "admin")
    if dry_run:
        return await _dry_run_direct(config, request, client, connect, timeout, events, identity, wall_clock)
    pieces = build_pieces(
        config,
        connect=connect,
        events=events,
        rng=random.Random(),
        providers={provider: client},
        serve=(provider,),
        identity=identity,
        wall=wall_clock,
    )
    session, keeper = pieces.session, pieces.keepers[provider]
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        keeper_scope = trio.CancelScope()

        async def keep() -> None:
            with keeper_scope:
                await keeper.run()

        nursery.start_soon(keep)
        try:
            with trio.move_on_after(timeout):
                await keeper.wait_valid()
                while not session.synced_for(provider):  # the resync the grant asked for (see daemon.builder)
                    await session.changed()
            if not keeper.valid():
                return AdminResult(
                    False,
                    f"could not get the lease for {provider!r} ({keeper.reason}); is the "
                    "daemon running for it? (see --help)",
                    via="direct",
                )
            result = await decide_and_act(config, request, pieces.actor(provider, via="direct"))
        finally:
            keeper_scope.cancel()
            with trio.CancelScope(shield=True):
                await keeper.release(timeout=3.0)
            nursery.cancel_scope.cancel()
    return result


async def act_with_plugins(
    config: Config,
    request: AdminRequest,
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 - passed on to act
) -> AdminResult:
    """The direct path as the command runs it: mutual TLS to the controller (``ConfigError`` when the TLS files
    cannot be loaded), the config's own plugin for the provider (supervised for the call) and its events log."""
    from provisionerd.controller.connect import tls_connector  # loads the TLS files now

    connect = tls_connector(config)
    async with open_clients(config, [request.provider]) as clients:
        return await act(
            config,
            request.kind,
            request.provider,
            request.machine_id,
            client=clients[request.provider],
            connect=connect,
            timeout=timeout,
            events=EventLog(config.daemon.events_log),
            user=request.user,
            dry_run=request.dry_run,
        )


async def _dry_run_direct(
    config: Config,
    request: AdminRequest,
    client: ProviderClient,
    connect: StreamFactory,
    timeout: float,  # noqa: ASYNC109 - passed on to read_controller_once
    events: EventLog,
    identity: str,
    wall_clock: Callable[[], float],
) -> AdminResult:
    """The direct dry run: a read-only client, a join without a lease, no executor at all."""
    guarded = ReadOnlyClient(client)
    controller = await read_controller_once(config, connect, timeout, identity=identity)
    actor = Actor(identity, "direct", guarded, lambda: controller, lambda: LeaseState(), None, events, wall_clock)
    return await decide_and_act(config, request, actor, lease_assumed=True)
