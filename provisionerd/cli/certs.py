"""``provisionerd certs init DIR --cluster NAME [--host H ...] [--force]``."""

from __future__ import annotations

import argparse
import sys

from provisionerd.domain.errors import ConfigError
from provisionerd.pki.certs import DEFAULT_HOSTS, init_certs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provisionerd certs", description="cluster CA and role certificates")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="create a CA and a certificate + key for each role in DIR")
    init.add_argument("directory", metavar="DIR")
    init.add_argument("--cluster", required=True, help="cluster name bound into every certificate")
    init.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="NAME",
        help=f"a DNS name or IP address the controller certificate is valid for (repeatable; "
        f"default {', '.join(DEFAULT_HOSTS)})",
    )
    init.add_argument("--force", action="store_true", help="overwrite existing files in DIR")
    return parser


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        written = init_certs(args.directory, args.cluster, tuple(args.hosts or DEFAULT_HOSTS), force=args.force)
    except ConfigError as exc:
        print(f"provisionerd certs: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"provisionerd certs: cannot write {args.directory!r}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
