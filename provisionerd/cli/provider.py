"""``provisionerd provider check``: run the conformance kit against a plugin and print a table of checks.
(``provisionerd provider path`` is ``provider_path.py``.)

    provisionerd provider check [--transport oneshot|persistent] [--json] [--conf-dir DIR] [--timeout S] PATH

One-shot: PATH is the directory of ``<action>.sh``. Persistent: PATH is an executable, or a directory holding an
executable named ``provider``. ``PRO_CONF_DIR`` is ``--conf-dir``, else ``PATH/conf`` when it exists;
``PRO_DATA_DIR`` is a fresh temporary directory; the cluster id is ``conformance``. Exit 0 only when every check
passed; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import trio

from provisionerd.cli import provider_path
from provisionerd.provider.kit import CLUSTER, CheckResult, Kit, KitOptions, detect_legacy
from provisionerd.provider.legacy.kit import legacy_checks
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import open_persistent_provider
from provisionerd.provider.runtime import Limits, ProviderConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provisionerd provider", description="provider plugin tools")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the conformance kit against a plugin")
    check.add_argument("path", metavar="PATH", type=Path)
    check.add_argument("--transport", choices=("oneshot", "persistent"), default="oneshot")
    check.add_argument("--json", action="store_true", help="print a JSON summary instead of a table")
    check.add_argument("--conf-dir", type=Path, help="PRO_CONF_DIR for the plugin (default: PATH/conf if present)")
    check.add_argument("--timeout", type=float, default=30.0, help="seconds per call before it counts as hung")
    sub.add_parser("path", help="print where a shipped plugin is installed (path [NAME])")
    return parser


def resolve_target(path: Path, transport: str) -> Path:
    """The plugin directory (one-shot) or executable (persistent); ``ValueError`` with the reason otherwise."""
    if transport == "oneshot":
        if not path.is_dir():
            raise ValueError(f"{path}: a one-shot plugin is a directory of <action>.sh scripts")
        return path
    exe = path / "provider" if path.is_dir() else path
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        raise ValueError(f"{exe}: a persistent plugin is an executable (or a directory with an executable 'provider')")
    return exe


def plugin_config(target: Path, transport: str, *, conf_dir: Path | None, data_dir: Path) -> ProviderConfig:
    """The runtime config of the plugin at ``target`` (its ``conf`` directory by default, when it has one)."""
    home = target if transport == "oneshot" else target.parent
    if conf_dir is None and (home / "conf").is_dir():
        conf_dir = home / "conf"
    return ProviderConfig(
        name=home.resolve().name or "plugin",
        cluster=CLUSTER,
        path=str(target.resolve()),
        transport=transport,
        conf_dir=str(conf_dir.resolve()) if conf_dir else "",
        data_dir=str(data_dir),
        limits=Limits(term_grace=0.5),
    )


async def check_plugin(
    target: Path, transport: str, *, conf_dir: Path | None, data_dir: Path, options: KitOptions
) -> list[CheckResult]:
    """Run the kit against the plugin at ``target`` (see ``resolve_target``)."""
    config = plugin_config(target, transport, conf_dir=conf_dir, data_dir=data_dir)
    if transport == "oneshot":
        client = OneShotProvider(config)
        if detect_legacy(target, transport):
            return await legacy_checks(client, options)
        return await Kit(client, options).run()
    async with open_persistent_provider(config) as persistent:
        return await Kit(persistent, options).run()


def format_table(rows: list[CheckResult]) -> str:
    width = max((len(r.name) for r in rows), default=0)
    lines = [f"{'PASS' if r.ok else 'FAIL'}  {r.name:<{width}}  {r.detail}" for r in rows]
    passed = sum(r.ok for r in rows)
    lines.append(f"{passed} passed, {len(rows) - passed} failed")
    return "\n".join(lines)


def summary(rows: list[CheckResult]) -> dict[str, object]:
    passed = sum(r.ok for r in rows)
    return {
        "passed": passed,
        "failed": len(rows) - passed,
        "checks": [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in rows],
    }


def main(argv: list[str]) -> int:
    """Exit code: 0 every check passed (or ``--help``), 1 a check failed, 2 bad arguments."""
    if argv[:1] == ["path"]:
        return provider_path.main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage (or the help); the caller gets a code, not an exit
        return 0 if exc.code in (0, None) else 2
    if args.timeout <= 0:
        print("provisionerd provider check: --timeout must be positive", file=sys.stderr)
        return 2
    try:
        target = resolve_target(args.path, args.transport)
    except ValueError as exc:
        print(f"provisionerd provider check: {exc}", file=sys.stderr)
        return 2
    if args.conf_dir is not None and not args.conf_dir.is_dir():
        print(f"provisionerd provider check: --conf-dir {args.conf_dir} is not a directory", file=sys.stderr)
        return 2
    options = KitOptions(timeout=args.timeout, settle=max(60.0, args.timeout))
    data_dir = Path(tempfile.mkdtemp(prefix="provisionerd-check-"))
    try:
        rows = trio.run(
            lambda: check_plugin(target, args.transport, conf_dir=args.conf_dir, data_dir=data_dir, options=options)
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(summary(rows)) if args.json else format_table(rows))
    return 0 if rows and all(r.ok for r in rows) else 1
