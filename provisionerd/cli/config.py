"""``provisionerd config check FILE``: list every problem in a config file, or summarize a good one.

The check is the one a daemon applies at start and on a SIGHUP reload (``config.proofs.load_proven``): the
document (schema, cross-field rules), then what it names (lease margin against the controller's TTL, heartbeat
against the controller's timeout, provider paths, TLS files: readable, matching, issued by the CA, not expired).
Every stage runs, whatever an earlier one found (``config.proofs.check_all``): an unknown key does not hide a
margin the controller's TTL cannot use.
``--document-only`` checks the document alone (for a file meant for another host).

Exit codes: 0 the file is valid; 1 it has problems (each printed as ``FILE: <path>: <message>`` on stderr);
2 usage error. The summary never prints provider ``env`` values, only how many there are.
"""

from __future__ import annotations

import argparse
import sys

from provisionerd.config.loader import Config
from provisionerd.config.proofs import check_all
from provisionerd.domain.errors import ConfigError


def summarize(config: Config) -> list[str]:
    """Human summary lines for a valid config (no secrets)."""
    c = config.controller
    lines = [
        f"cluster {config.cluster!r}, identity {config.identity!r}",
        f"controllers: {', '.join(c.addresses)} (heartbeat {c.heartbeat_interval:g}s, dead after"
        f" {c.heartbeat_timeout:g}s)",
        f"tls: ca {config.tls.ca}, cert {config.tls.cert}, key {config.tls.key}",
        f"lease margin {config.lease.margin:g}s"
        + ("" if config.lease.controller_ttl is None else f" (controller TTL {config.lease.controller_ttl:g}s)"),
    ]
    for p in config.providers:
        where = " ".join(p.argv) if p.argv else str(p.path)
        lines.append(
            f"provider {p.name!r}: {p.transport} {where}; max {p.max_machines} machines, step floor {p.step_limit},"
            f" join deadline {p.join_deadline:g}s, orphans {p.orphans.action}"
            f"{' (dry run)' if p.orphans.dry_run else ''}, {len(p.env)} env value(s)"
        )
    return lines


def _report(file: str, problems: list[str]) -> int:
    print(f"{file}: {len(problems)} problem(s)", file=sys.stderr)
    for problem in problems:
        print(f"{file}: {problem}", file=sys.stderr)
    return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provisionerd config", description="configuration tools")
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="validate a config file and list every problem with its path")
    check.add_argument("file", help="the TOML config file")
    check.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    check.add_argument(
        "--document-only",
        action="store_true",
        help="check the document alone, not the files it names nor the TLS material (a file for another host)",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    if args.document_only:
        try:
            config: Config | None = Config.from_file(args.file)
        except ConfigError as exc:
            return _report(args.file, list(exc.problems))
    else:
        config, problems = check_all(args.file)
        if config is None:
            return _report(args.file, problems)
    assert config is not None
    if not args.quiet:
        print(f"{args.file}: ok")
        for line in summarize(config):
            print(f"  {line}")
    return 0
