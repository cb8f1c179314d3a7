"""``provisionerd cost``: the estimated spend of a running daemon's machines, from the facts.

    provisionerd cost (--config FILE | --socket PATH) [--live] [--json]

Asks the daemon (admin socket, command ``cost``) for the estimate ``planner.cost`` makes from the facts: per
machine, the price quote it was chosen at (``InstanceFact.price``) times the hours from its launch to its
confirmed return (``Returned.at``) or to now. By default over the whole history of the daemon's providers: the
daemon reads the controller's fact log page by page (the history query, docs/protocol.md §6.6), ended lifecycles
included; ``--live``: only the machines the daemon's view holds (no controller read). Lines by provider, template
and currency; totals per currency (amounts in different currencies are never added); machines that cannot be
estimated are counted apart (unpriced, not per hour, no time). An estimate, not a bill (docs/fleet.md).

Exit 0 on an answer, 1 when the daemon cannot be reached, has no view yet or cannot read the controller's
history, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from provisionerd.cli.admin_target import add_target, ask

#: How long to wait for the daemon's answer: it reads the whole history (its own bound is 120 s).
TIMEOUT = 130.0


def render(cost: dict[str, Any]) -> list[str]:
    lines = [f"{'PROVIDER':<16} {'TEMPLATE':<24} {'CUR':<4} {'MACHINES':>8} {'HOURS':>12} {'AMOUNT':>14}"]
    for line in cost.get("lines", []):
        lines.append(
            f"{line['provider']:<16} {line['template_id']:<24} {line['currency']:<4} {line['machines']:>8}"
            f" {line['machine_hours']:>12.3f} {line['amount']:>14.4f}"
        )
    for currency, amount in sorted(cost.get("totals", {}).items()):
        lines.append(f"total {currency}: {amount:.4f}")
    skipped = {k: v for k, v in cost.get("not_estimated", {}).items() if v}
    if skipped:
        lines.append("not estimated: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(skipped.items())))
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="provisionerd cost", description="estimated spend, from the facts")
    add_target(parser)
    parser.add_argument("--live", action="store_true", help="only the machines the daemon's view holds (no history)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    reply = ask("provisionerd cost", args, "cost", {"scope": "live" if args.live else "history"}, TIMEOUT)
    if reply is None:
        return 1
    if not isinstance(reply.get("cost"), dict):
        print("provisionerd cost: no cost report in the answer", file=sys.stderr)
        return 1
    if args.json:
        extra = {key: reply[key] for key in ("scope", "history") if key in reply}
        print(json.dumps({"at": reply.get("at"), **extra, **reply["cost"]}, indent=2, sort_keys=True))
    else:
        print("\n".join(render(reply["cost"])))
    return 0
