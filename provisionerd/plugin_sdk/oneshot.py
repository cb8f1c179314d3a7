"""The one-shot transport: ``<action>.sh -f in.json`` runs one call in one process.

The result document on stdout and exit 0; a refusal is ``{"error": body}`` on stdout and exit 1 (as LSF plugins
report failure). Usage errors and an unreadable, oversized or non-JSON input file are ``invalid_request`` refusals
like any other: the daemon always gets a typed document. Everything written is scrubbed of the call's join tokens.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from provisionerd.plugin_sdk.calls import Handler, Loaded, load_plugin, run_action
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.redact import Redactor, join_tokens

MAX_INPUT_BYTES = 8 << 20
USAGE = "usage: <action>.sh -f <input.json>"


def read_input(argv: list[str], max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """The input document named by ``argv`` (``["-f", path]``). Raises ``PluginError("invalid_request")``."""
    if len(argv) != 2 or argv[0] != "-f":
        raise PluginError("invalid_request", USAGE)
    try:
        with open(argv[1], "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise PluginError("invalid_request", f"cannot read the input file: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise PluginError("invalid_request", f"the input is larger than {max_bytes} bytes")
    try:
        return json.loads(data)
    except ValueError:
        raise PluginError("invalid_request", "the input file is not JSON") from None


def emit(ok: bool, body: dict[str, Any], doc: Any = None, redactor: Redactor | None = None) -> int:
    """Write the answer (scrubbed of ``doc``'s join tokens) and return the exit status: 0, or 1 for a refusal."""
    text = json.dumps(body if ok else {"error": body})
    sys.stdout.write((redactor or Redactor()).scrub(text, join_tokens(doc)) + "\n")
    sys.stdout.flush()
    return 0 if ok else 1


def serve_oneshot(
    factory: Callable[[], Handler], action: str, argv: list[str], redactor: Redactor | None = None
) -> int:
    """Read the input, make the plugin (``factory()``, only once the input was read: a bad call costs no set-up),
    run ``action`` and write the answer; returns the exit status."""
    doc: Any = None
    try:
        doc = read_input(argv)
    except PluginError as err:
        plugin: Loaded = err
    else:
        plugin = load_plugin(factory)
    ok, body = run_action(plugin, action, doc, redactor)
    return emit(ok, body, doc, redactor)
