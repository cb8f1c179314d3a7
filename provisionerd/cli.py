"""The ``provisionerd`` command: dispatches to each subcommand's own module.

Each subcommand module exposes ``main(argv: list[str]) -> int`` and parses its own arguments, so this file stays a
table and a subcommand's flags live next to the code they drive.
"""

from __future__ import annotations

import importlib
import sys

from provisionerd import __version__

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("provisionerd.agent_cli", "run the worker agent on a machine (agent --certs DIR --controllers ADDRS ...)"),
    "certs": ("provisionerd.certs_cli", "create a cluster CA and role certificates (certs init DIR --cluster NAME)"),
    "provider": ("provisionerd.provider.check_cli", "provider plugin tools (provider check PATH)"),
    "config": ("provisionerd.config_cli", "check a daemon config file (config check FILE)"),
    "status": ("provisionerd.status_cli", "show a running daemon's link, primary and leases (status --config FILE)"),
    "run": ("provisionerd.run_cli", "run the daemon (run --config FILE)"),
    "simulate": ("provisionerd.simulate_cli", "seeded whole-system simulation campaign (simulate --seeds N)"),
    "demo": ("provisionerd.demo_cli", "run the whole system on this host: controller, daemon, workers (demo [--workers N])"),
    "orphans": ("provisionerd.orphans_cli", "report what looks orphaned (--dry-run), or adopt|return one finding"),
}


def _usage() -> str:
    lines = [f"usage: provisionerd <command> [args]   (provisionerd {__version__})", "", "commands:"]
    lines += [f"  {name:<10} {helptext}" for name, (_, helptext) in sorted(COMMANDS.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
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
