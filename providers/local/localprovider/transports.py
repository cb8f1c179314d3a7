"""The two transports: ``oneshot ACTION -f IN.json`` (one call per process) and ``persistent`` (JSON lines).

One-shot: the answer on stdout, exit 0; a refusal is the error document on stdout with exit 1. Persistent: one
request per line on stdin, one answer per line on stdout, in order (calls are short: starting or signalling a
process, reading a few files); EOF on stdin ends the process. Logs go to stderr and never carry a join token.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from localprovider.actions import Provider
from localprovider.errors import PluginError

MAX_LINE = 8 << 20


def _unexpected(exc: Exception) -> PluginError:
    # The text of an unexpected error names the failure, not the input (which may hold join tokens).
    print(f"local provider: internal error: {type(exc).__name__}", file=sys.stderr)
    return PluginError("provider_error", f"internal error in the local provider: {type(exc).__name__}")


def oneshot(args: list[str]) -> int:
    if len(args) != 3 or args[1] != "-f":
        print("usage: run.py oneshot ACTION -f IN.json", file=sys.stderr)
        return 2
    action, path = args[0], args[2]
    try:
        try:
            with open(path, "rb") as handle:
                doc = json.loads(handle.read(MAX_LINE))
        except (OSError, ValueError) as exc:
            raise PluginError("invalid_request", f"cannot read the input document: {type(exc).__name__}") from None
        result = Provider(os.environ).call(action, doc)
    except PluginError as exc:
        print(json.dumps({"error": exc.document()}))
        return 1
    except Exception as exc:  # noqa: BLE001 - the contract wants a typed document for any failure
        print(json.dumps({"error": _unexpected(exc).document()}))
        return 1
    print(json.dumps(result))
    return 0


def _answer(provider: Provider | None, setup_error: PluginError | None, line: bytes) -> dict[str, Any] | None:
    try:
        request = json.loads(line)
    except ValueError:
        print("local provider: ignoring a line that is not JSON", file=sys.stderr)
        return None
    if not isinstance(request, dict) or not isinstance(request.get("id"), int):
        print("local provider: ignoring a request without an integer id", file=sys.stderr)
        return None
    ident = request["id"]
    try:
        if provider is None:
            raise setup_error or PluginError("provider_error", "not configured")
        return {"id": ident, "result": provider.call(str(request.get("action")), request.get("input"))}
    except PluginError as exc:
        return {"id": ident, "error": exc.document()}
    except Exception as exc:  # noqa: BLE001
        return {"id": ident, "error": _unexpected(exc).document()}


def persistent(args: list[str]) -> int:
    provider: Provider | None = None
    setup_error: PluginError | None = None
    try:
        provider = Provider(os.environ, persistent=True)
    except PluginError as exc:
        setup_error = exc  # answer every call with it rather than die in a restart loop
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = stdin.readline(MAX_LINE)
        if not line:
            return 0
        if not line.strip():
            continue
        answer = _answer(provider, setup_error, line)
        if answer is not None:
            stdout.write(json.dumps(answer).encode() + b"\n")
            stdout.flush()
