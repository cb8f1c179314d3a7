"""``provisionerd explain`` and ``provisionerd plan --what-if``: why the planner does what it does, per demand item.

    provisionerd explain (--config FILE | --socket PATH) [DEMAND_ID] [--json]
    provisionerd plan --what-if FILE (--config FILE | --socket PATH) [--json]

Both ask the running daemon (admin socket, commands ``explain`` and ``plan_what_if``), which runs its own pure
planner on its live inputs and changes nothing (``provisionerd.daemon.explain_admin``). ``explain`` plans with the
live demand; ``plan --what-if`` with the demand document FILE instead (the demand item schema of
``refcontroller admin demand --file``: a JSON array of ``{"demand_id", "shape", "count", ...}``) and prints the
actions the daemon would take. Per item: wanted, supplied, outstanding, reused, requested, unmet; for what is
unmet every offer with its verdict and the rule that stopped it, with its figures; for a surplus, which idle
machines go, and when or what holds them. Times are UTC. ``--json`` prints the daemon's document.

Exit 0 on an answer, 1 when the daemon cannot be reached or refuses, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from provisionerd.cli.admin_target import add_target, ask

TIMEOUT = 60.0
#: The what-if document is sent in parts of at most this many bytes as JSON strings (the admin socket reads request
#: lines of at most 4 KiB).
PART = 3000
EPILOG = """\
verdicts per offer, for what is unmet:
  requested     asked for in full          limited   asked for, held by a limit (named)
  blocked       skipped now, with why: capacity back-off until T, throttled until T,
                provider unhealthy since T, max_machines N/N, maxNumber, step limit
  untried       never looked at: the global step window is full (until T)
  incompatible  every attribute that does not fit, wanted vs offered
  not_leased    the lease of its provider is not held here (standby)
GATES name what holds the plan's actions outside the planner: halted (amnesia),
no lease, an unhealthy provider, a settle window after a rejoin.

exit 0 on an answer, 1 when the daemon cannot be reached or refuses, 2 on usage errors"""


def _clock(at: Any) -> str:
    if not isinstance(at, int | float):
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(at))


#: A wall-clock time inside a reason (the planner writes ``until 1796493143.3``): shown as a UTC time of day.
_WALL = re.compile(r"\b(1\d{9})(\.\d+)?\b")


def times(text: str) -> str:
    """``text`` with each wall-clock time in it as ``HH:MM:SSZ``."""
    return _WALL.sub(lambda m: time.strftime("%H:%M:%SZ", time.gmtime(float(m.group(0)))), text)


def render(document: dict[str, Any]) -> list[str]:
    """The document as the operator reads it (times UTC)."""
    return [times(line) for line in _lines(document)]


def _lines(document: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if document.get("what_if"):
        lines.append("WHAT-IF: the plan for this demand on the daemon's live view (nothing was done)")
    for gate in document.get("gates", []):
        lines.append(f"GATE {gate}")
    for item in document.get("items", []):
        lines.append(
            f"{item['demand_id']}: wanted {item['wanted']}, supplied {item['supplied']}, outstanding "
            f"{item['outstanding']}, reused {item['reused']}, requested {item['requested']}, unmet {item['unmet']}"
        )
        lines.append(f"  why: {item['summary']}")
        for offer in item.get("offers", []):
            count = f" x{offer['count']}" if offer.get("count") else ""
            # A priority is named where one is set (lower is used first; 0 everywhere: price alone decides).
            priority = [f"priority {offer['priority']}"] if offer.get("priority") else []
            why = "; ".join([*priority, *offer.get("reasons", [])])
            lines.append(
                f"  {offer['verdict']:<12} {offer['provider']}/{offer['template_id']}{count}{': ' if why else ''}{why}"
            )
        if item.get("offers_more"):
            lines.append(f"  ...          {item['offers_more']} more offers (explain {item['demand_id']} lists all)")
        for machine in item.get("surplus", []):
            when = machine["when"]
            at = "now" if when == "now" else f"{when} {_clock(machine.get('at'))}"
            lines.append(
                f"  surplus      {machine['machine_id']} ({machine['provider']}) goes {at}: {machine['reason']}"
            )
        if item.get("surplus_more"):
            lines.append(f"  surplus      ... and {item['surplus_more']} more")
        if item.get("surplus_busy"):
            lines.append(f"  busy         {item['surplus_busy']} machine(s) busy: never returned while busy")
    actions = document.get("actions", [])
    lines.append(f"actions ({len(actions)}):" if actions else "actions: none")
    lines += [f"  {action}" for action in actions]
    notes = document.get("notes", [])
    if notes:
        lines.append("notes:")
        lines += [f"  {note}" for note in notes]
    return lines


def _print(document: dict[str, Any], as_json: bool) -> int:
    try:
        if as_json:
            print(json.dumps({k: v for k, v in document.items() if k != "ok"}, sort_keys=True))
        else:
            for line in render(document):
                print(line)
    except BrokenPipeError:  # `provisionerd explain | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def split(text: str, limit: int = PART) -> list[str]:
    """``text`` in parts each at most ``limit`` bytes once JSON-escaped (escapes may make a character 6 bytes)."""
    parts: list[str] = []
    start = 0
    while start < len(text):
        size = limit
        while size > 1 and len(json.dumps(text[start : start + size])) > limit:
            size //= 2
        parts.append(text[start : start + size])
        start += size
    return parts or [""]


def main(argv: list[str]) -> int:
    """``provisionerd explain``."""
    parser = argparse.ArgumentParser(
        prog="provisionerd explain",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="per demand item: what the planner does now, and the exact rule that stops what it does not",
        epilog=EPILOG,
    )
    add_target(parser)
    parser.add_argument("demand_id", nargs="?", help="only this demand item")
    parser.add_argument("--json", action="store_true", help="the daemon's document as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    fields = {} if args.demand_id is None else {"demand_id": args.demand_id}
    reply = ask("provisionerd explain", args, "explain", fields, TIMEOUT)
    return 1 if reply is None else _print(reply, args.json)


def plan_main(argv: list[str]) -> int:
    """``provisionerd plan --what-if FILE``."""
    parser = argparse.ArgumentParser(
        prog="provisionerd plan",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="the actions the daemon's planner would take for a hypothetical demand, and why; changes nothing",
        epilog=EPILOG,
    )
    add_target(parser)
    parser.add_argument(
        "--what-if", required=True, type=Path, metavar="FILE", help="a demand document (JSON array of demand items)"
    )
    parser.add_argument("--json", action="store_true", help="the daemon's document as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        text = args.what_if.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"provisionerd plan: cannot read {args.what_if}: {exc}", file=sys.stderr)
        return 2
    parts = split(text)
    upload: str | None = None
    for n, part in enumerate(parts):
        fields: dict[str, Any] = {"part": part, "more": n < len(parts) - 1}
        if upload is not None:
            fields["upload"] = upload
        reply = ask("provisionerd plan", args, "plan_what_if", fields, TIMEOUT)
        if reply is None:
            return 1
        if fields["more"]:
            upload = reply.get("upload")
            continue
        return _print(reply, args.json)
    return 1
