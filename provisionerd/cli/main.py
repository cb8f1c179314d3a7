"""The ``provisionerd`` command: dispatches to each subcommand's own module.

Each subcommand module exposes ``main(argv: list[str]) -> int`` and parses its own arguments, so this file stays a
table and a subcommand's flags live next to the code they drive.
"""

from __future__ import annotations

import importlib
import sys

from provisionerd import __version__
from provisionerd.cli.closed_pipe import quiet_on_closed_pipe

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": (
        "provisionerd.cli.agent",
        "run the worker agent on a machine (agent --certs DIR --controllers ADDRS ...)",
    ),
    "certs": ("provisionerd.cli.certs", "create a cluster CA and role certificates (certs init DIR --cluster NAME)"),
    "provider": ("provisionerd.cli.provider", "provider plugin tools (provider check PATH | provider path [NAME])"),
    "config": ("provisionerd.cli.config", "check a daemon config file (config check FILE)"),
    "controller": (
        "provisionerd.cli.controller",
        "accept a controller that forgot (controller accept-reset --config FILE)",
    ),
    "cost": ("provisionerd.cli.cost", "estimated spend by provider, template, currency (cost --config FILE)"),
    "explain": (
        "provisionerd.cli.explain",
        "per demand item, what the planner does and the rule that stops the rest (explain --config FILE [ID])",
    ),
    "history": ("provisionerd.cli.history", "the controller's fact log, ended lifecycles too (history --config FILE)"),
    "machines": (
        "provisionerd.cli.machines",
        "every machine, its state and next planned action (machines --config FILE [--provider P] [--state S])",
    ),
    "plan": (
        "provisionerd.cli.plan",
        "the actions a hypothetical demand would get, and why; changes nothing (plan --what-if FILE --config F)",
    ),
    "reload": ("provisionerd.cli.reload", "re-read a running daemon's config, exit 1 if it failed (reload --socket P)"),
    "status": ("provisionerd.cli.status", "show a running daemon's link, primary and leases (status --config FILE)"),
    "run": ("provisionerd.cli.run", "run the daemon (run --config FILE)"),
    "simulate": ("provisionerd.cli.simulate", "seeded whole-system simulation campaign (simulate --seeds N)"),
    "demo": (
        "provisionerd.cli.demo",
        "run the whole system on this host: controller, daemon, workers (demo [--workers N])",
    ),
    "orphans": ("provisionerd.cli.orphans", "report what looks orphaned (--dry-run), or adopt|return one finding"),
}


def _usage() -> str:
    lines = [f"usage: provisionerd <command> [args]   (provisionerd {__version__})", "", "commands:"]
    lines += [f"  {name:<10} {helptext}" for name, (_, helptext) in sorted(COMMANDS.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return quiet_on_closed_pipe(lambda: _dispatch(args))


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(__version__)
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"provisionerd: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
