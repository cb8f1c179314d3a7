"""``provisionerd history``: the controller's fact log for a running daemon's providers, ended lifecycles included.

    provisionerd history (--config FILE | --socket PATH) [--after N] [--until N] [--limit N] [--all] [--json]

Asks the daemon (admin socket, command ``history``), which reads the controller's log through the history query
(docs/protocol.md §6.6) as its provisioner: only its own providers. One page by default (at most ``--limit``
facts, at most the controller's page of 500); ``--all`` follows the cursor to the end of the log as it was when the
first page was read. Plain output is a header line, then one line per fact: its index, when the controller
committed it (UTC, to the second; ``-`` when the controller does not say: one older than commit times, or a fact
committed before it kept them), provider, kind, op id and what it is about. ``--json`` prints one JSON object per
fact per line (``committed_at`` in epoch seconds, 0 when not known), no header. When more facts follow, the
command to read them is printed on stderr.

Exit 0 on an answer, 1 when the daemon cannot be reached or cannot read the controller's history, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from typing import Any

from provisionerd.cli.admin_target import add_target, ask

#: Pages ``--all`` reads at most (500 facts each).
MAX_PAGES = 100_000
#: How long to wait for one page (the daemon's own bound is 15 s).
TIMEOUT = 20.0


def _about(fact: dict[str, Any]) -> str:
    for key in ("machine_id", "machine_ids", "instance_ref", "template_id", "reason"):
        value = fact.get(key)
        if value:
            return ",".join(value) if isinstance(value, list) else str(value)
    return ""


def committed(at: object) -> str:
    """A commit time as UTC ISO-8601 to the second (``2026-12-05T23:04:05Z``); ``-`` when not known (0, absent)."""
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at <= 0:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(int(at), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # beyond what a date can say: the number as it came
        return f"{at:.6g}"


#: The columns of the plain output (``render``), printed once before the first line.
HEADER = f"{'INDEX':>10} {'COMMITTED (UTC)':<20} {'PROVIDER':<16} {'KIND':<15} {'OP ID':<28} ABOUT"


def render(fact: dict[str, Any]) -> str:
    return (
        f"{fact['index']:>10} {committed(fact.get('committed_at')):<20} {fact['provider']:<16} {fact['kind']:<15}"
        f" {fact['op_id']:<28} {_about(fact)}"
    )


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="provisionerd history", description="the controller's fact log, paged")
    add_target(parser)
    parser.add_argument("--after", type=_count, default=0, help="facts after this index (the cursor)")
    parser.add_argument("--until", type=_count, default=0, help="facts up to this index (0: the log's last)")
    parser.add_argument("--limit", type=_count, default=0, help="facts per page (0: the controller's page, 500)")
    parser.add_argument("--all", action="store_true", help="every page to the end of the log")
    parser.add_argument("--json", action="store_true", help="one JSON object per fact per line")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    after, until = args.after, args.until
    for page in range(MAX_PAGES if args.all else 1):
        fields = {"after": after, "until": until, "limit": args.limit}
        reply = ask("provisionerd history", args, "history", fields, TIMEOUT)
        if reply is None:
            return 1
        if page == 0 and not args.json:
            print(HEADER)
        for fact in reply.get("facts", []):
            print(json.dumps(fact, sort_keys=True) if args.json else render(fact))
        after, until = int(reply.get("next_after", after)), int(reply.get("until_index", until))
        if reply.get("done"):
            return 0
    print(f"provisionerd history: more facts follow: --after {after} --until {until}", file=sys.stderr)
    return 0
