"""``provisionerd controller accept-reset``: the admin's decision after the controller forgot what it acknowledged.

``provisionerd controller accept-reset (--config FILE | --socket PATH) [--json]``
    When the running daemon found controller amnesia (another incarnation of its fact log, a last index below what
    it acknowledged, an epoch granted again: ``provisionerd status`` shows it), every mutation is stopped and every
    machine kept. This tells the daemon, through its admin socket, to remember the controller as it is now and let
    mutations resume. What the forgotten log held is not recovered: machines it explained are unexplained now, and
    the orphan policy (report by default) decides what happens to them.

Exit codes: 0 accepted; 1 the daemon cannot be reached, or had no amnesia to accept; 2 bad arguments or config.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from provisionerd.cli.admin_target import TargetError, add_target, socket_of
from provisionerd.daemon.admin_socket import request
from provisionerd.daemon.orphan_admin import current_user

PROG = "provisionerd controller"


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:  # the conformance kit: its own module (cli/controller_check.py)
        return importlib.import_module("provisionerd.cli.controller_check").main(argv[1:])
    parser = argparse.ArgumentParser(prog=PROG, description="decide about the cluster controller")
    ops = parser.add_subparsers(dest="op", required=True)
    accept = ops.add_parser("accept-reset", help="accept that the controller forgot; let mutations resume")
    add_target(accept)
    accept.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        path = socket_of(args)
    except TargetError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        reply = request(path, {"cmd": "controller_accept_reset", "user": current_user()})
    except (OSError, ValueError) as exc:
        print(f"{PROG}: cannot reach the daemon at {path}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(reply, indent=2, sort_keys=True))
    if not reply.get("ok"):
        print(f"{PROG}: {reply.get('error')}", file=sys.stderr)
        return 1
    if not args.json:
        accepted, memory = reply.get("accepted", {}), reply.get("memory", {})
        print(
            f"reset accepted ({accepted.get('reason')}): controller incarnation {memory.get('incarnation')!r},"
            f" last index {memory.get('last_index')}; mutations resume"
        )
    return 0
