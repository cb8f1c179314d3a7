"""``provisionerd controller check``: the conformance kit against a running controller (docs/controllers.md).

    provisionerd controller check --connect ADDR[,ADDR...] --certs DIR [--admin] [--json] [--only NAME]...
                                  [--timeout S] [--grace-wait S] [--max-frame BYTES]

``--connect`` lists every replica (the redirect row needs a standby); ``--certs`` is a directory as
``provisionerd certs init`` makes it (``ca.pem`` and ``<role>.pem``/``.key`` for provisioner, worker and admin;
a role without its files makes its rows NOT RUN). ``--admin`` lets the kit make the controller lose its quorum
and fail over (the reference controller's admin API): run it only against a test controller. The kit leases and
commits only on providers of its own (``kit-<random>-*``) and ends its intents at the end.

Prints one row per check (PASS, FAIL or NOT RUN, with the evidence), or with ``--json`` one JSON document.
Exit codes: 0 no row failed; 1 a row failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio

from provisionerd.conformance.battery import CHECKS, run_battery
from provisionerd.conformance.context import KitOptions
from provisionerd.controller.connect import parse_address
from provisionerd.domain.errors import ConfigError

PROG = "provisionerd controller check"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="check a cluster controller against the protocol")
    parser.add_argument("--connect", required=True, help="HOST:PORT of every replica, comma-separated")
    parser.add_argument("--certs", required=True, type=Path, help="directory made by 'provisionerd certs init'")
    parser.add_argument("--admin", action="store_true", help="also the failover and quorum rows (admin API)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--only", action="append", default=[], help="a row's name or rule (repeatable)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (10)")
    parser.add_argument("--grace-wait", type=float, default=90.0, help="longest wait out of a grace (90)")
    parser.add_argument("--max-frame", type=int, default=1 << 20, help="the deployment's frame limit (1 MiB)")
    return parser


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        addresses = [a.strip() for a in args.connect.split(",") if a.strip()]
        for address in addresses:
            parse_address(address)
        if not addresses:
            raise ConfigError("--connect names no address")
        if not (args.certs / "ca.pem").is_file():
            raise ConfigError(f"--certs {args.certs}: no ca.pem")
        known = {c.name for c in CHECKS} | {c.rule for c in CHECKS}
        unknown = [name for name in args.only if name not in known]
        if unknown:
            raise ConfigError(f"--only: no row or rule named {', '.join(map(repr, unknown))}")
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    options = KitOptions(admin=args.admin, timeout=args.timeout, grace_wait=args.grace_wait, max_frame=args.max_frame)
    report = trio.run(run_battery, args.certs, addresses, options, tuple(args.only))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        width = max(len(row.name) for row in report.rows) if report.rows else 10
        for row in report.rows:
            print(f"{row.status.value:<8} {row.name:<{width}}  {row.evidence}")
        counts = report.to_json()["counts"]
        print(f"\n{counts} in {report.seconds:.1f}s; cleanup: {report.cleanup}")
    return 0 if report.ok else 1
