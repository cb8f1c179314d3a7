"""``provisionerd reload``: ask a running daemon (through its admin socket) to re-read its config, and say how it went.

    provisionerd reload (--socket PATH | --config FILE) [--json]

The same reload as SIGHUP (``DaemonCore.reload``): the daemon re-reads its own config file, applies every change
that can change live and names what needs a restart. Unlike ``kill -HUP``, the command waits for the result, so it
is what the shipped unit's ``ExecReload=`` runs: ``systemctl reload`` fails when the reload failed (systemd 252
takes a reload's result from this exit status; see ``daemon.systemd``).

Exit 0 when the reload was applied, changed nothing, or only named changes that need a restart (those are printed
on stderr: the running values stay in force until a restart); 1 when the reload failed (the problems are printed;
the running config stays in force) or the daemon cannot be reached; 2 on usage errors. ``--socket`` works while
the config file on disk is broken, which is when a failed reload needs it.
"""

from __future__ import annotations

import argparse
import json
import sys

from provisionerd.cli.admin_target import add_target, ask

PROG = "provisionerd reload"
#: The daemon answers within its own 30 s bound (a reload reads one file and proves it).
TIMEOUT = 35.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="re-read a running daemon's config and report the result")
    add_target(parser)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    reply = ask(PROG, args, "reload", timeout=TIMEOUT)
    if reply is None:
        return 1
    result = reply.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("outcome"), str):
        print(f"{PROG}: no reload result in the answer", file=sys.stderr)
        return 1
    outcome = result["outcome"]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        applied = ", ".join(result.get("applied") or []) or "nothing"
        print(f"{PROG}: {outcome}; applied: {applied}")
    for field in result.get("restart_needed") or []:
        print(f"{PROG}: needs a restart to take effect (the running value stays): {field}", file=sys.stderr)
    if outcome == "failed":
        for problem in result.get("problems") or []:
            print(f"{PROG}: failed, the running config stays in force: {problem}", file=sys.stderr)
        return 1
    return 0
