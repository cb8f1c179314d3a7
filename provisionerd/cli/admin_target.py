"""Which running daemon a command talks to: ``--socket PATH``, or ``--config FILE`` and its ``daemon.admin_socket``.

Shared by the commands that ask a daemon through its admin socket (``status``, ``cost``, ``controller
accept-reset``); each keeps its own exit codes.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provisionerd.config.loader import Config
from provisionerd.daemon.admin_socket import CLIENT_TIMEOUT, request
from provisionerd.domain.errors import ConfigError


class TargetError(Exception):
    """The daemon's admin socket cannot be named: a bad config, or one that sets no ``daemon.admin_socket``."""


def add_target(parser: argparse.ArgumentParser) -> None:
    """``--socket PATH`` or ``--config FILE``, exactly one."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", type=Path, help="the daemon's admin socket")
    where.add_argument("--config", type=Path, help="the daemon's config file (for daemon.admin_socket)")


def socket_of(args: argparse.Namespace) -> Path:
    """The admin socket ``args`` name (``TargetError`` with a one-line reason when there is none).

    A config file that no longer loads (after an edit that a reload refused, say) still names the running daemon's
    socket when its TOML parses and ``daemon.admin_socket`` is a string: that is read alone, so ``status`` and
    ``reload`` reach the daemon when they are most needed."""
    if args.socket is not None:
        return Path(args.socket)
    try:
        path = Config.from_file(args.config).daemon.admin_socket
    except ConfigError as exc:
        path = _socket_from_document(Path(args.config), exc)
    if path is None:
        raise TargetError("the config sets no daemon.admin_socket")
    return path


def _socket_from_document(config: Path, refused: ConfigError) -> Path:
    """``daemon.admin_socket`` read alone from a config file that does not load as a whole."""
    why = str(refused).splitlines()[0]
    try:
        document = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        raise TargetError(f"{why}; name the daemon's admin socket with --socket PATH") from None
    daemon = document.get("daemon")
    value = daemon.get("admin_socket") if isinstance(daemon, dict) else None
    if not isinstance(value, str) or not value:
        raise TargetError(f"{why}; it names no daemon.admin_socket: use --socket PATH") from None
    path = Path(value)
    return path if path.is_absolute() else (config.parent / path).resolve()  # as the loader resolves it


def ask(
    prog: str,
    args: argparse.Namespace,
    cmd: str,
    fields: Mapping[str, Any] | None = None,
    timeout: float = CLIENT_TIMEOUT,
) -> dict[str, Any] | None:
    """The daemon's answer to ``cmd`` (with the request's other ``fields``), or ``None`` after printing why there
    is none (no socket named, the daemon unreachable, or an answer that is not ``ok``) as ``prog: reason`` on
    stderr."""
    try:
        path = socket_of(args)
    except TargetError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    try:
        reply = request(path, {**(fields or {}), "cmd": cmd}, timeout)
    except (OSError, ValueError) as exc:
        print(f"{prog}: cannot reach the daemon at {path}: {exc}", file=sys.stderr)
        return None
    if not reply.get("ok"):
        print(f"{prog}: {reply.get('error')}", file=sys.stderr)
        return None
    return reply
