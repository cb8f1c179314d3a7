"""One call, whatever the plugin does: a result or an error body, never an exception or a traceback on stdout.

``run_action`` is what both transports run for each call. A ``PluginError`` becomes its error body; any other
exception (a bug) becomes ``provider_error`` naming the exception's type, with the traceback logged (scrubbed). The
error message is scrubbed of the call's join tokens before it is logged or returned. stderr gets one JSON line per
call: ``{"ts", "action", "outcome", "ms", "op_id"?, "message"?}``; never the input or the output.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from provisionerd.plugin_sdk.errors import PluginError, internal_error
from provisionerd.plugin_sdk.redact import Redactor, join_tokens

EVENTS = logging.getLogger("provisionerd.plugin_sdk.calls")


class Handler(Protocol):
    """What a plugin gives the transports: one method that answers any action (the contract's action names)."""

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        """The action's result document; raises ``PluginError`` to refuse."""
        ...


#: A plugin, or the ``PluginError`` that stopped it from loading (a broken config answers every call with it,
#: rather than a restart loop).
Loaded = Handler | PluginError


def load_plugin(factory: Callable[[], Handler]) -> Loaded:
    """``factory()``, or the ``PluginError`` it raised (a broken config, a missing data directory)."""
    try:
        return factory()
    except PluginError as err:
        return err


def run_action(load: Loaded, action: str, doc: Any, redactor: Redactor | None = None) -> tuple[bool, dict[str, Any]]:
    """``(True, result)`` or ``(False, error body)``; never raises an ``Exception``."""
    redactor = redactor or Redactor()
    started = time.monotonic()
    try:
        if isinstance(load, PluginError):
            raise load
        ok, body, outcome = True, load.handle(action, doc), "ok"
    except PluginError as err:
        ok, body, outcome = False, err.document(), err.code
    except Exception as exc:  # noqa: BLE001 - a bug must still answer with an error document
        ok, body, outcome = False, internal_error(exc).document(), "internal_error"
        EVENTS.error("internal error in %s:\n%s", action, redactor.scrub(traceback.format_exc(), join_tokens(doc)))
    event: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "action": action,
        "outcome": outcome,
        "ms": round((time.monotonic() - started) * 1000, 1),
    }
    if isinstance(doc, dict) and isinstance(doc.get("op_id"), str):
        event["op_id"] = doc["op_id"][:64]
    if not ok:
        body["message"] = redactor.scrub(str(body["message"]), join_tokens(doc))
        event["message"] = body["message"]
    EVENTS.info("%s", json.dumps(event))
    return ok, body


def dispatch(
    actions: Mapping[str, Callable[[Any], dict[str, Any]]],
    action: str,
    doc: Any,
    check: Callable[[str, Any], list[str]] | None = None,
) -> dict[str, Any]:
    """Answer ``action`` from the plugin's table of actions: ``invalid_request`` for one it does not have, or
    for an input ``check`` finds problems with (for example the contract's own schemas,
    ``provisionerd.provider.schemas.contract().input_problems``)."""
    handler = actions.get(action)
    if handler is None:
        detail = "not supported (features.stopMachines is false)" if action == "stopMachines" else "unknown action"
        raise PluginError("invalid_request", f"{action!r}: {detail}")
    problems = check(action, doc) if check is not None else []
    if problems:
        raise PluginError("invalid_request", "input fails the contract schema: " + "; ".join(problems[:5]))
    return handler(doc)
