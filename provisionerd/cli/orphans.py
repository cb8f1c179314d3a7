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
    Acts on one finding explicitly (see :mod:`provisionerd.daemon.orphan_admin`): through the running daemon's admin
    socket (``[daemon] admin_socket``), which acts with its own lease, gate and executor; only when no daemon
    listens there (no socket file, connection refused) with the command's own lease. ``--dry-run`` changes nothing
    on either path.

``--socket PATH`` instead of ``--config FILE`` (both forms): only through the running daemon at that admin
socket, with its running config (the report: admin command ``orphans_report``). A ``--config`` file that no longer
loads as a whole but still names ``daemon.admin_socket`` goes the same way, with a note on stderr: after a refused
reload the daemon still runs the config it had, and that is the one to report with.

This module parses the arguments, prints and picks the exit code; the report is ``daemon.orphan_report.dry_run``,
the choice of path and the direct path are ``daemon.orphan_direct``.

Exit codes: 0 done; 1 a view could not be read (each one is named on stderr; the report is still printed, with
those findings blocked) or the action was refused, failed or not finished in time; 2 bad arguments or config.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from provisionerd.cli.admin_target import TargetError, socket_of
from provisionerd.config.loader import Config
from provisionerd.daemon import orphan_admin
from provisionerd.daemon.admin_socket import request as admin_request
from provisionerd.daemon.orphan_admin import KINDS, AdminRequest, current_user, policy_of
from provisionerd.daemon.orphan_direct import act_with_plugins, via_daemon, via_socket
from provisionerd.daemon.orphan_report import DryRunReport, dry_run
from provisionerd.domain.errors import ConfigError
from provisionerd.orphans.report import blind_spots, render_json, render_table

PROG = "provisionerd orphans"


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
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the daemon's TOML config file")
    where.add_argument(
        "--socket", type=Path, help="ask the running daemon at this admin socket for the report (its running config)"
    )
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
    if args.socket is not None:
        return _report_via_daemon(args.socket, args)
    socket = _running_socket(args.config)
    if socket is not None:
        return _report_via_daemon(socket, args)
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


def _running_socket(config: str) -> Path | None:
    """The admin socket of the running daemon when the file ``config`` does not load as a whole but still names
    one that a daemon serves (``None`` otherwise: the file loads, or names no socket, or none is served there);
    says on stderr that the running daemon's config answers instead of the file's."""
    try:
        Config.from_file(config)
    except ConfigError as exc:
        try:
            path = socket_of(argparse.Namespace(socket=None, config=config))
        except TargetError:
            return None
        if not path.is_socket():
            return None
        print(
            f"{PROG}: {exc.args[0].splitlines()[0]}; asking the running daemon at {path} (its running config)",
            file=sys.stderr,
        )
        return path
    return None


def _report_via_daemon(socket: Path, args: argparse.Namespace) -> int:
    """The dry-run report made by the running daemon (admin command ``orphans_report``)."""
    fields = {"cmd": "orphans_report", "providers": list(args.provider), "timeout": min(args.timeout, 30.0)}
    try:
        reply = admin_request(socket, fields, timeout=min(args.timeout, 30.0) + 20.0)
    except (OSError, ValueError) as exc:
        print(f"{PROG}: cannot reach the daemon at {socket}: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok") or not isinstance(reply.get("report"), dict):
        print(f"{PROG}: {reply.get('error') or 'no report in the answer'}", file=sys.stderr)
        return 1
    print(json.dumps(reply["report"], indent=2) if args.json else str(reply.get("table", "")))
    unreadable = [str(line) for line in reply.get("unreadable") or []]
    for line in unreadable:
        print(f"{PROG}: {line}", file=sys.stderr)
    return 1 if unreadable else 0


def admin_main(argv: list[str]) -> int:
    """``provisionerd orphans adopt|return``: through the daemon, else directly (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog=f"{PROG} adopt|return",
        description=orphan_admin.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=KINDS)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--config")
    where.add_argument("--socket", type=Path, help="only through the running daemon at this admin socket")
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
    request = AdminRequest(args.kind, args.provider, args.machine, current_user(), args.dry_run)
    socket: Path | None = args.socket
    config: Config | None = None
    if socket is None and (socket := _running_socket(args.config)) is None:
        try:
            config = load_config(args.config, [args.provider])
        except ConfigError as exc:
            print_config_error(exc)
            return 2
    if config is None:  # through the daemon only: without a config this command cannot act itself
        assert socket is not None
        result = via_socket(socket, request)
        if result is None:
            print(f"{PROG} {args.kind}: no daemon listens at {socket}", file=sys.stderr)
            return 1
    elif (result := via_daemon(config, request)) is None:
        try:
            result = trio.run(functools.partial(act_with_plugins, config, request, timeout=args.timeout))
        except ConfigError as exc:  # the TLS files could not be loaded
            print_config_error(exc)
            return 2
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True, default=str))
    else:
        print(f"{PROG} {args.kind}: {result.message}", file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1
