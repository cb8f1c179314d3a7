"""Which running daemon a command talks to: ``--socket PATH``, or ``--config FILE`` and its ``daemon.admin_socket``.

Shared by the commands that ask a daemon through its admin socket (``status``, ``cost``, ``controller
accept-reset``); each keeps its own exit codes.
"""

from __future__ import annotations

import argparse
import sys
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
    """The admin socket ``args`` name (``TargetError`` with a one-line reason when there is none)."""
    if args.socket is not None:
        return Path(args.socket)
    try:
        path = Config.from_file(args.config).daemon.admin_socket
    except ConfigError as exc:
        raise TargetError(str(exc)) from None
    if path is None:
        raise TargetError("the config sets no daemon.admin_socket")
    return path


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
