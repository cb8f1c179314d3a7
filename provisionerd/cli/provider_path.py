"""``provisionerd provider path``: where the shipped provider plugins are installed.

    provisionerd provider path NAME      the plugin's directory (one line, for a config's ``path`` or a script)
    provisionerd provider path [--json]  every shipped plugin: name, directory, what it is

The names are the plugins' directories under ``providers/`` in the source tree (``local``, ``examples/bash``, ...);
the directories printed are inside the installed package (``provisionerd.resources``). A persistent plugin's
executable is ``provider`` in its directory; a one-shot plugin's ``<action>.sh`` scripts are there. Exit 0, 1 when
the install lacks the plugin, 2 for an unknown name or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from provisionerd import resources


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provisionerd provider path", description="print where a shipped provider plugin is installed"
    )
    parser.add_argument("name", metavar="NAME", nargs="?", help=f"one of: {', '.join(resources.PLUGINS)}")
    parser.add_argument("--json", action="store_true", help="print every plugin as a JSON object")
    return parser


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage (or the help)
        return 0 if exc.code in (0, None) else 2
    if args.name is None:
        rows = [(name, resources.plugin_dir(name), about) for name, about in resources.PLUGINS.items()]
        if args.json:
            print(json.dumps({name: {"path": str(path), "about": about} for name, path, about in rows}, indent=2))
        else:
            width = max(len(name) for name, _, _ in rows)
            print("\n".join(f"{name:<{width}}  {path}\n{'':<{width}}  {about}" for name, path, about in rows))
        return 0
    try:
        path = resources.plugin_dir(args.name)
    except resources.UnknownPlugin as exc:
        print(f"provisionerd provider path: {exc}", file=sys.stderr)
        return 2
    if not path.is_dir():
        print(f"provisionerd provider path: {args.name} is not at {path}: the install is incomplete", file=sys.stderr)
        return 1
    print(json.dumps({"name": args.name, "path": str(path)}) if args.json else path)
    return 0
