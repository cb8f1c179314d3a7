"""``provisionerd provider check``: run the conformance kit against a plugin and print a table of checks.
(``provisionerd provider path`` is ``provider_path.py``.)

    provisionerd provider check [--transport oneshot|persistent] [--json] [--conf-dir DIR] [--data-dir DIR]
                                [--env KEY=VALUE]... [--env-file FILE] [--timeout S] [--settle S] PATH

One-shot: PATH is the directory of ``<action>.sh``. Persistent: PATH is an executable, or a directory holding an
executable named ``provider``. ``PRO_CONF_DIR`` is ``--conf-dir``, else ``PATH/conf`` when it exists;
``PRO_DATA_DIR`` is ``--data-dir`` (kept), else a fresh temporary directory, removed at the end only when nothing
was left behind (the plugin's own records of a machine it could not return stay there, and the report names the
directory). ``--env`` / ``--env-file`` (``KEY=VALUE`` lines, ``#`` comments) add variables to the plugin's
environment; their values are taken as secrets: redacted from every row of the report. The cluster id is
``conformance``. Exit 0 only when every check passed (warnings pass); 2 for bad arguments. Log lines (the
runtime's warnings, on stderr) are written once each, and those repeated are counted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import attrs
import trio

from provisionerd.cli import provider_path
from provisionerd.provider.kit import CLUSTER, RETURN_ROW, CheckResult, Kit, KitOptions, detect_legacy
from provisionerd.provider.legacy.kit import legacy_checks
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import open_persistent_provider
from provisionerd.provider.runtime import Limits, ProviderConfig
from provisionerd.telemetry.files import make_private_dir
from provisionerd.telemetry.log_collapse import collapsed_logs
from provisionerd.telemetry.redaction import Redactor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provisionerd provider", description="provider plugin tools")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the conformance kit against a plugin")
    check.add_argument("path", metavar="PATH", type=Path)
    check.add_argument("--transport", choices=("oneshot", "persistent"), default="oneshot")
    check.add_argument("--json", action="store_true", help="print a JSON summary instead of a table")
    check.add_argument("--conf-dir", type=Path, help="PRO_CONF_DIR for the plugin (default: PATH/conf if present)")
    check.add_argument("--data-dir", type=Path, help="PRO_DATA_DIR for the plugin, kept (default: a temporary one)")
    check.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="a variable for the plugin (repeatable)"
    )
    check.add_argument("--env-file", type=Path, help="KEY=VALUE lines for the plugin's environment")
    check.add_argument("--timeout", type=float, default=30.0, help="seconds per call before it counts as hung")
    check.add_argument(
        "--settle",
        type=float,
        help="seconds a request may stay running and a returned machine stay listed (default: max(60, --timeout))",
    )
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


def parse_env(pairs: list[str], env_file: Path | None) -> dict[str, str]:
    """The variables of ``--env-file`` then ``--env`` (later wins); ``ValueError`` naming the bad entry (never its
    value: it may be a secret)."""
    lines: list[tuple[str, str]] = []
    if env_file is not None:
        try:
            text = env_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--env-file {env_file}: cannot be read ({exc.__class__.__name__})") from None
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append((f"--env-file {env_file} line {number}", line.strip()))
    lines.extend((f"--env #{i + 1}", pair) for i, pair in enumerate(pairs))
    env: dict[str, str] = {}
    for where, line in lines:
        key, sep, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        if not sep or not _ENV_KEY.fullmatch(key):
            raise ValueError(f"{where}: not KEY=VALUE with KEY a variable name")
        env[key] = value
    return env


_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def plugin_config(
    target: Path, transport: str, *, conf_dir: Path | None, data_dir: Path, env: dict[str, str] | None = None
) -> ProviderConfig:
    """The runtime config of the plugin at ``target`` (its ``conf`` directory by default, when it has one).
    ``env`` values reach the plugin as credentials: redacted from everything the runtime reports."""
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
        credentials=dict(env or {}),
        limits=Limits(term_grace=0.5),
    )


async def check_plugin(
    target: Path,
    transport: str,
    *,
    conf_dir: Path | None,
    data_dir: Path,
    options: KitOptions,
    env: dict[str, str] | None = None,
) -> list[CheckResult]:
    """Run the kit against the plugin at ``target`` (see ``resolve_target``); every row redacted of ``env``'s
    values."""
    config = plugin_config(target, transport, conf_dir=conf_dir, data_dir=data_dir, env=env)
    options = attrs.evolve(options, data_dir=options.data_dir or str(data_dir))
    redact = Redactor().including((env or {}).values())
    rows = await _run_kit(config, target, transport, options)
    return [attrs.evolve(r, detail=redact(r.detail)) for r in rows]


async def _run_kit(config: ProviderConfig, target: Path, transport: str, options: KitOptions) -> list[CheckResult]:
    if transport == "oneshot":
        client = OneShotProvider(config)
        if detect_legacy(target, transport):
            return await legacy_checks(client, options)
        return await Kit(client, options).run()
    async with open_persistent_provider(config) as persistent:
        return await Kit(persistent, options).run()


def format_table(rows: list[CheckResult]) -> str:
    width = max((len(r.name) for r in rows), default=0)
    lines = [f"{_mark(r)}  {r.name:<{width}}  {r.detail}" for r in rows]
    passed = sum(r.ok for r in rows)
    warned = sum(r.ok and r.warning for r in rows)
    lines.append(f"{passed} passed ({warned} with a warning), {len(rows) - passed} failed")
    return "\n".join(lines)


def _mark(row: CheckResult) -> str:
    return "FAIL" if not row.ok else "WARN" if row.warning else "PASS"


def summary(rows: list[CheckResult]) -> dict[str, object]:
    passed = sum(r.ok for r in rows)
    return {
        "passed": passed,
        "failed": len(rows) - passed,
        "warnings": sum(r.ok and r.warning for r in rows),
        "checks": [{"name": r.name, "ok": r.ok, "warning": r.warning, "detail": r.detail} for r in rows],
    }


def main(argv: list[str]) -> int:
    """Exit code: 0 every check passed (or ``--help``), 1 a check failed, 2 bad arguments."""
    if argv[:1] == ["path"]:
        return provider_path.main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage (or the help); the caller gets a code, not an exit
        return 0 if exc.code in (0, None) else 2
    for flag, value in (("--timeout", args.timeout), ("--settle", args.settle)):
        if value is not None and not 0 < value < float("inf"):
            print(f"provisionerd provider check: {flag} must be a positive number of seconds", file=sys.stderr)
            return 2
    try:
        target = resolve_target(args.path, args.transport)
    except ValueError as exc:
        print(f"provisionerd provider check: {exc}", file=sys.stderr)
        return 2
    if args.conf_dir is not None and not args.conf_dir.is_dir():
        print(f"provisionerd provider check: --conf-dir {args.conf_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        env = parse_env(args.env, args.env_file)
    except ValueError as exc:
        print(f"provisionerd provider check: {exc}", file=sys.stderr)
        return 2
    settle = max(60.0, args.timeout) if args.settle is None else args.settle
    options = KitOptions(timeout=args.timeout, settle=settle, budget=max(180.0, 6 * args.timeout, 3 * settle))
    if args.data_dir is not None:
        data_dir, keep = args.data_dir.resolve(), True
        try:
            make_private_dir(data_dir)
        except OSError as exc:
            print(f"provisionerd provider check: --data-dir {args.data_dir}: {exc.strerror}", file=sys.stderr)
            return 2
    else:
        data_dir, keep = Path(tempfile.mkdtemp(prefix="provisionerd-check-")), False
    rows: list[CheckResult] = []
    try:
        with collapsed_logs():  # a plugin that breaks the schema on every call: one line per cause, with a count
            rows = trio.run(
                lambda: check_plugin(
                    target, args.transport, conf_dir=args.conf_dir, data_dir=data_dir, options=options, env=env
                )
            )
    finally:
        # A temporary data dir goes only when nothing is left: it holds the plugin's record of what it made.
        left = any(not r.ok and r.name == RETURN_ROW for r in rows) or not rows
        if not keep and not left:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(summary(rows)) if args.json else format_table(rows))
    return 0 if rows and all(r.ok for r in rows) else 1
