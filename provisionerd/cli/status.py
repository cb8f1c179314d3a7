"""``provisionerd status``: ask a running daemon (through its admin socket) for its link and leases.

``--socket PATH`` or ``--config FILE`` (its ``daemon.admin_socket``). ``--json`` prints the raw document. Exit 0 on
an answer, 1 when the daemon cannot be reached or the config names no socket, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from provisionerd.cli.admin_target import TargetError, add_target, socket_of
from provisionerd.daemon.admin_socket import query


def render(status: dict[str, Any]) -> list[str]:
    link = status.get("link", {})
    lines = [
        f"daemon {status.get('identity')!r} of cluster {status.get('cluster')!r}",
        f"link: {link.get('state')}  primary: {link.get('primary') or '-'}  term: {link.get('term')}"
        f"  generation: {link.get('generation')}  demand seq: {link.get('demand_seq')}",
    ]
    if link.get("last_error"):
        lines.append(f"last link error: {link['last_error']}")
    finding = status.get("controller", {}).get("finding")
    if finding:
        lines.append(f"CONTROLLER AMNESIA ({finding.get('reason')}): {finding.get('detail')}")
        lines.append(
            "  every mutation is stopped; after checking, run: provisionerd controller accept-reset --config FILE"
        )
    for lease in status.get("leases", []):
        remaining = lease.get("remaining")
        validity = f"valid for {remaining:.1f}s" if isinstance(remaining, (int, float)) else "not valid"
        lines.append(
            f"provider {lease['provider']!r}: {lease['state']}  epoch {lease.get('epoch') or '-'}  {validity}"
            f"  ({lease.get('reason', '')})"
        )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="provisionerd status", description="show a running daemon's state")
    add_target(parser)
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        path = socket_of(args)
    except TargetError as exc:
        print(f"provisionerd status: {exc}", file=sys.stderr)
        return 1
    try:
        reply = query(path)
    except (OSError, ValueError) as exc:
        print(f"provisionerd status: cannot reach the daemon at {path}: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"provisionerd status: {reply.get('error')}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(reply["status"], indent=2, sort_keys=True))
    else:
        print("\n".join(render(reply["status"])))
    return 0
