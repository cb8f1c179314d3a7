"""What both transports share: running one action safely, scrubbing, and the stderr log.

Everything written passes through the redactor with the call's join tokens; stderr gets one JSON line per call
(action, outcome, duration, and the error message if any), never inputs or outputs.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.plugin import Plugin
from aws_ec2_plugin.redact import Redactor

MAX_INPUT_BYTES = 8 << 20


def join_tokens(doc: Any) -> list[str]:
    """The join tokens in an input document, so this call's output can be scrubbed of them."""
    boot = doc.get("bootstrap") if isinstance(doc, dict) else None
    if not isinstance(boot, list):
        return []
    return [b["joinToken"] for b in boot if isinstance(b, dict) and isinstance(b.get("joinToken"), str)]


def run_action(plugin: Plugin | PluginError, redactor: Redactor, action: str, doc: Any) -> tuple[bool, dict[str, Any]]:
    """``(ok, result-or-error-body)``: never raises, whatever the plugin does.

    An error message is scrubbed here, with this call's join tokens, before it is logged or returned: EC2 messages
    may quote the parameters they were sent.
    """
    started = time.monotonic()
    op_id = doc.get("op_id") if isinstance(doc, dict) else None
    try:
        if isinstance(plugin, PluginError):
            raise plugin
        ok, body = True, plugin.handle(action, doc)
        outcome = "ok"
    except PluginError as err:
        ok, body = False, err.document()
        outcome = err.code
    except Exception as exc:  # noqa: BLE001 - a bug must still answer with an error document, not a traceback
        ok, body = (
            False,
            {"code": "provider_error", "message": f"internal error: {type(exc).__name__}", "retryable": False},
        )
        outcome = "internal_error"
        logging.getLogger(__name__).error(
            "internal error in %s:\n%s", action, redactor.scrub(traceback.format_exc(), join_tokens(doc))
        )
    event = {
        "ts": round(time.time(), 3),
        "action": action,
        "outcome": outcome,
        "ms": round((time.monotonic() - started) * 1000, 1),
    }
    if isinstance(op_id, str):
        event["op_id"] = op_id[:64]
    if not ok:
        body["message"] = redactor.scrub(str(body["message"]), join_tokens(doc))
        event["message"] = body["message"]
    logging.getLogger("aws_ec2.events").info("%s", json.dumps(event))
    return ok, body


class _RedactingFormatter(logging.Formatter):
    def __init__(self, redactor: Callable[[str], str]) -> None:
        super().__init__("aws_ec2 %(levelname)s %(message)s")
        self._redact = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(super().format(record))


def setup_logging(redactor: Redactor) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter(redactor.scrub))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def load(redactor: Redactor) -> Plugin | PluginError:
    try:
        return Plugin.from_environment(redactor)
    except PluginError as err:
        return err
