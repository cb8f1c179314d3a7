"""``provisionerd orphans``: the admin's view of what looks orphaned, and explicit actions on one finding.

``provisionerd orphans --config FILE --dry-run [--json] [--provider NAME ...] [--timeout SECONDS]``
    Reads every provider's ``listMachines`` first, then joins the controller as its own provisioner identity
    (``<identity>-orphans-report``), which makes the controller send a resync of the facts and hosts; it acquires
    no lease and commits nothing, and its provider clients refuse every action but the read-only ones. It then
    classifies as the daemon would, with no lease held, so each automatic action shows the action that would be
    taken and everything that blocks it (``no_lease`` and ``dry_run`` at least), and prints a table or, with
    ``--json``, ``{"findings": [...], "mutations": 0}`` (plus ``invisible`` and ``unknown_outcomes`` when a
    provider, such as a legacy LSF plugin, cannot list machines: that is stated, not an unreadable listing). The
    controller is taken as settled: the settle window is the running daemon's own, which this command cannot see.

``provisionerd orphans adopt|return --config FILE --provider P --machine ID [--dry-run] [--json]``
    Acts on one finding explicitly (see :mod:`provisionerd.orphans_admin`): through the running daemon's admin
    socket (``[daemon] admin_socket``), which acts with its own lease, gate and executor; only when no daemon
    listens there (no socket file, connection refused) with the command's own lease. ``--dry-run`` changes nothing
    on either path.

Exit codes: 0 done; 1 a view could not be read (each one is named on stderr; the report is still printed, with
those findings blocked) or the action was refused, failed or not finished in time; 2 bad arguments or config.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.config.loader import Config
from provisionerd.controller.session import ControllerSession, LinkState, SessionSettings, StreamFactory
from provisionerd.daemon.admin_socket import request as socket_request
from provisionerd.daemon.orphan_admin import KINDS, AdminRequest, AdminResult, act, action_timeout, current_user
from provisionerd.daemon.orphans import ReadOnlyClient, policy_of
from provisionerd.domain.errors import ConfigError
from provisionerd.execution.orphan_cycle import open_ops_of, with_owners
from provisionerd.execution.orphan_reads import ControllerRead, read_listing, unknown_outcomes
from provisionerd.orphans.classify import Observation, OrphanPolicy, classify
from provisionerd.orphans.model import (
    BreakerState,
    ControllerState,
    Finding,
    LeaseState,
    Listing,
    ListingAbsent,
    Unreadable,
)
from provisionerd.orphans.report import blind_spots, render_json, render_table
from provisionerd.provider.persistent import PersistentProvider
from provisionerd.provider.runtime import ProviderClient
from provisionerd.telemetry.events import EventLog

PROG = "provisionerd orphans"


def side_identity(identity: str, role: str) -> str:
    """This command's own controller identity (``<identity>-orphans-<role>``, within the 63-character limit)."""
    suffix = f"-orphans-{role}"
    return identity[: 63 - len(suffix)] + suffix


async def read_controller_once(
    config: Config, connect: StreamFactory, timeout: float, *, identity: str
) -> ControllerRead:
    """Join the controller as ``identity``, wait for the resync, and return the view (no lease, no commit)."""
    settings = attrs.evolve(SessionSettings.from_config(config), identity=identity)
    session = ControllerSession(settings, connect, EventLog(), random.Random())
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
    # Joined means joined to the primary (a standby redirects). Settled: see the module docstring.
    return ControllerRead(view.facts, tuple(view.hosts.values()), ControllerState(primary=True, settled=True))


@contextlib.asynccontextmanager
async def open_clients(config: Config, names: Sequence[str]) -> AsyncIterator[dict[str, ProviderClient]]:
    """The daemon's own provider clients for ``names`` (persistent plugins supervised until the block exits)."""
    from provisionerd.daemon.root import provider_clients

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


@attrs.frozen
class DryRunReport:
    findings: tuple[Finding, ...]
    breakers: Mapping[str, BreakerState]
    unreadable: tuple[str, ...]  # one line per view that could not be read
    mutations: int
    calls: Mapping[str, tuple[str, ...]]  # provider -> every action asked of it
    invisible: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)  # provider -> classes it cannot see
    unknown_outcomes: Mapping[str, tuple[dict[str, Any], ...]] = attrs.field(factory=dict)  # of those providers


async def dry_run(
    config: Config,
    *,
    providers: Sequence[str] = (),
    clients: Mapping[str, ProviderClient] | None = None,
    connect: StreamFactory | None = None,
    timeout: float = 30.0,
    wall_clock: Callable[[], float] = time.time,
) -> DryRunReport:
    """The dry-run report. ``clients``/``connect`` default to the config's plugins and mutual TLS."""
    names = tuple(providers) or config.provider_names
    policies = {name: policy_of(config.provider(name), dry_run=True) for name in names}
    if connect is None:
        from provisionerd.controller.connect import tls_connector  # loads the TLS files: ConfigError when they are bad

        connect = tls_connector(config)
    if clients is None:
        async with open_clients(config, names) as opened:
            return await _dry_run(config, names, policies, opened, connect, timeout, wall_clock)
    return await _dry_run(config, names, policies, clients, connect, timeout, wall_clock)


async def _dry_run(
    config: Config,
    names: Sequence[str],
    policies: Mapping[str, OrphanPolicy],
    clients: Mapping[str, ProviderClient],
    connect: StreamFactory,
    timeout: float,
    wall_clock: Callable[[], float],
) -> DryRunReport:
    guarded = {name: ReadOnlyClient(clients[name]) for name in names}
    listings: dict[str, Listing] = {}
    for name in names:  # every listing before the controller's view (see Observation)
        timeout_for = config.provider(name).timeouts.for_action("listMachines")
        listings[name] = await read_listing(guarded[name], config.cluster, timeout=timeout_for)
    controller = await read_controller_once(config, connect, timeout, identity=side_identity(config.identity, "report"))
    # A provider without a listing (ListingAbsent) is not unreadable: the report states what it cannot see.
    unreadable = [
        f"the listing of provider {name!r} could not be read: {listing.reason}"
        for name, listing in listings.items()
        if isinstance(listing, Unreadable) and not isinstance(listing, ListingAbsent)
    ]
    absent = {name: listing for name, listing in listings.items() if isinstance(listing, ListingAbsent)}
    if isinstance(controller.view, Unreadable):
        unreadable.append(f"the controller's view could not be read: {controller.view.reason}")
    findings: list[Finding] = []
    breakers: dict[str, BreakerState] = {}
    now = wall_clock()
    for name in names:
        obs = Observation(
            cluster_id=config.cluster,
            provider=name,
            now=now,
            listing=listings[name],
            view=controller.view,
            hosts=controller.hosts,
            lease=LeaseState(),  # this command holds no lease, ever
            controller=controller.controller,
        )
        result = classify(obs, policies[name])
        findings += with_owners(result.findings, open_ops_of(controller.view, name))
        breakers[name] = result.breaker
    return DryRunReport(
        findings=tuple(findings),
        breakers=breakers,
        unreadable=tuple(unreadable),
        mutations=sum(c.mutations for c in guarded.values()),
        calls={name: tuple(c.calls) for name, c in guarded.items()},
        invisible={name: listing.invisible for name, listing in absent.items()},
        unknown_outcomes={name: unknown_outcomes(guarded[name]) for name in absent},
    )


def render(report: DryRunReport, as_json: bool) -> str:
    if as_json:
        return render_json(report.findings, report.mutations, report.invisible, report.unknown_outcomes)
    text = render_table(report.findings, report.mutations)
    for name, breaker in report.breakers.items():
        if breaker.open:
            text += (
                f"\nprovider {name!r}: circuit breaker open: {', '.join(breaker.reasons)} "
                f"({breaker.suspects} of {breaker.known} known machines look orphaned)"
            )
    for line in blind_spots(report.invisible, report.unknown_outcomes):
        text += "\n" + line
    return text


ACTIONS_HELP = """\
acting on one finding:
  provisionerd orphans adopt|return --config FILE --provider P --machine ID [--dry-run] [--json]
  asks the running daemon through its admin socket ([daemon] admin_socket); the daemon decides and acts with its
  own lease, gate and executor. Only when no daemon listens (no socket file, connection refused) does the command
  act itself, with its own lease (refused while anyone else holds it). --dry-run changes nothing on either path.
  See provisionerd orphans adopt --help."""


def _report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="report what looks orphaned (changes nothing)",
        epilog=ACTIONS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the daemon's TOML config file")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        required=True,
        help="classify and report only (required; to act on one finding, see adopt|return below)",
    )
    parser.add_argument("--json", action="store_true", help='print {"findings": [...], "mutations": N}')
    parser.add_argument("--provider", action="append", default=[], help="only this provider (repeatable)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the controller (30)")
    return parser


def load_config(path: str, providers: Sequence[str]) -> Config:
    """The config, with every named provider in it and every orphan policy valid; ``ConfigError`` otherwise."""
    config = Config.from_file(path)
    unknown = [name for name in providers if name not in config.provider_names]
    if unknown:
        raise ConfigError(
            f"{path}: no provider named {', '.join(map(repr, unknown))}",
            [f"providers: configured are {', '.join(config.provider_names)}"],
        )
    for provider in config.providers:
        policy_of(provider)
    return config


def print_config_error(exc: ConfigError) -> None:
    print(f"{PROG}: {exc.args[0].splitlines()[0]}", file=sys.stderr)
    for problem in exc.problems:
        print(f"  {problem}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if argv and argv[0] in KINDS:
        return admin_main(argv)
    try:
        args = _report_parser().parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if not args.timeout > 0:
        print(f"{PROG}: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        config = load_config(args.config, args.provider)
        report = trio.run(lambda: dry_run(config, providers=args.provider, timeout=args.timeout))
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    print(render(report, args.json))
    for line in report.unreadable:
        print(f"{PROG}: {line}", file=sys.stderr)
    return 1 if report.unreadable else 0


def via_daemon(config: Config, request: AdminRequest) -> AdminResult | None:
    """Ask the running daemon (blocking); ``None`` when none listens on the config's admin socket (no socket
    configured, no socket file, or the connection refused), so the caller may act directly. Any other failure is
    a result (not ok) and must not lead to acting directly."""
    path = config.daemon.admin_socket
    if path is None:
        return None
    wait = action_timeout(config, request.provider) + 5.0  # the daemon answers "pending" before this
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


def admin_main(argv: list[str]) -> int:
    """``provisionerd orphans adopt|return``: through the daemon, else directly (see the module docstring)."""
    from provisionerd.daemon import orphan_admin as orphans_admin

    parser = argparse.ArgumentParser(
        prog=f"{PROG} adopt|return",
        description=orphans_admin.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--config", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="direct path: seconds to wait for the controller and the lease (30)"
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if not args.timeout > 0:
        print(f"{PROG}: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, [args.provider])
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    request = AdminRequest(args.kind, args.provider, args.machine, current_user(), args.dry_run)
    result = via_daemon(config, request)
    if result is None:
        try:
            from provisionerd.controller.connect import tls_connector

            connect = tls_connector(config)
        except ConfigError as exc:
            print_config_error(exc)
            return 2

        async def run() -> AdminResult:
            async with open_clients(config, [args.provider]) as clients:
                return await act(
                    config,
                    args.kind,
                    args.provider,
                    args.machine,
                    client=clients[args.provider],
                    connect=connect,
                    timeout=args.timeout,
                    events=EventLog(config.daemon.events_log),
                    user=request.user,
                    dry_run=args.dry_run,
                )

        result = trio.run(run)
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True, default=str))
    else:
        print(f"{PROG} {args.kind}: {result.message}", file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1
