"""``provisionerd machines``: every machine a running daemon tracks, with the next planned action on it and when.

    provisionerd machines (--config FILE | --socket PATH) [--provider P] [--state S] [--json] [--limit N]

Asks the daemon (admin socket, command ``machines``) page by page (a cursor) until the listing ends, so the daemon
never spends more than a page's worth of work at once, whatever the fleet's size. One line per machine: id,
provider, template, demand item, state (booting, joined, idle, busy, lost, returning), joined or not, busy or
idle, age, idle since, the op that made it, and the next planned action with its time and rule, e.g.
``return at 14:02:05 (idle, idle_time 600 s)``, ``drain at 16:00:00 (max_ttl, max_ttl 3600 s)``,
``return at 13:15:00 (never_joined, join_deadline 900 s)``. The times come from the planner's own rules
(``provisionerd.planner.outlook``); times are UTC. ``--json`` prints one JSON object per machine per line.

Exit 0 on an answer, 1 when the daemon cannot be reached or refuses the request, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from provisionerd.cli.admin_target import add_target, ask

STATES = ("booting", "joined", "idle", "busy", "lost", "returning")
#: Pages read at most (a guard: the daemon's listing ends long before).
MAX_PAGES = 100_000
TIMEOUT = 10.0
EPILOG = """\
One line per machine: id, provider, template, demand item, state (booting, joined,
idle, busy, lost, returning), joined or not, age, idle since, the op that made it,
and NEXT, the planner's next action on it, from its own rules:
  return at 14:02:05 (idle, idle_time 600 s)       surplus idle machine
  return at 13:15:00 (never_joined, join_deadline 900 s)
  drain at 16:00:00 (max_ttl, max_ttl 86400 s)      busy machine past max_ttl
  return at 16:20:00 (drain_timeout, drain_timeout 3600 s)
  kept: its demand item needs it | kept: busy | returning: return in flight
A time holds while the inputs do (a new demand snapshot, or another machine
retired first, can change it); the disruption budget may pace a return after it.
The daemon is read page by page (--limit machines each), never all at once.

exit 0 on an answer, 1 when the daemon cannot be reached or refuses, 2 on usage errors"""
HEADER = (
    f"{'MACHINE':<24} {'PROVIDER':<12} {'TEMPLATE':<14} {'DEMAND':<12} {'STATE':<9} {'JOINED':<6} {'AGE':>8} "
    f"{'IDLE SINCE':<10} {'OP':<28} NEXT"
)


def _clock(at: Any) -> str:
    if not isinstance(at, int | float):
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(at))


def _age(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def next_text(line: dict[str, Any]) -> str:
    """The next planned action as the operator reads it."""
    action, reason, rule = line.get("next_action"), line.get("next_reason", ""), line.get("next_rule", "")
    if line.get("next_at") is None:
        return f"{action}: {reason}" if reason else str(action)
    why = ", ".join(part for part in (reason, rule) if part)
    return f"{action} at {_clock(line['next_at'])} ({why})"


def render(line: dict[str, Any]) -> str:
    offer = f"{line['template']}/{line['instance_type']}" if line.get("instance_type") else line["template"]
    return (
        f"{line['machine_id']:<24} {line['provider']:<12} {offer:<14} {line['demand_id'] or '-':<12} "
        f"{line['state']:<9} {'yes' if line['joined'] else 'no':<6} {_age(line.get('age_s')):>8} "
        f"{_clock(line.get('idle_since')):<10} {line['op_id']:<28} {next_text(line)}"
    )


def _limit(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be from 1 to 1000")
    return value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="provisionerd machines",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="every machine the daemon tracks, with the next planned action on it and when (times UTC)",
        epilog=EPILOG,
    )
    add_target(parser)
    parser.add_argument("--provider", help="only this provider's machines")
    parser.add_argument("--state", choices=STATES, help="only machines in this state")
    parser.add_argument("--json", action="store_true", help="one JSON object per machine per line")
    parser.add_argument("--limit", type=_limit, default=250, help="machines per page asked of the daemon (1-1000)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    fields: dict[str, Any] = {"limit": args.limit}
    if args.provider is not None:
        fields["provider"] = args.provider
    if args.state is not None:
        fields["state"] = args.state
    cursor: str | None = None
    try:
        for page in range(MAX_PAGES):
            reply = ask("provisionerd machines", args, "machines", {**fields, "cursor": cursor}, TIMEOUT)
            if reply is None:
                return 1
            if page == 0 and not args.json:
                print(HEADER)
            for line in reply.get("machines", []):
                print(json.dumps(line, sort_keys=True) if args.json else render(line))
            cursor = reply.get("cursor")
            if not cursor:
                return 0
    except BrokenPipeError:  # `provisionerd machines | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0
    print("provisionerd machines: stopped after too many pages", file=sys.stderr)
    return 1
