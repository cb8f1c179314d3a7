"""One-shot transport (LSF resource-connector style): ``<action>.sh -f in.json``.

The result document on stdout and exit 0; otherwise an error document ``{"error": {...}}`` on stdout and exit 1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from aws_ec2_plugin.calls import MAX_INPUT_BYTES, join_tokens, load, run_action, setup_logging
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.redact import Redactor


def main(action: str, argv: list[str]) -> int:
    redactor = Redactor.from_environment()
    setup_logging(redactor)
    if len(argv) != 2 or argv[0] != "-f":
        print(
            json.dumps(
                {
                    "error": {
                        "code": "invalid_request",
                        "message": "usage: <action>.sh -f <input.json>",
                        "retryable": False,
                    }
                }
            )
        )
        return 1
    doc: Any = None
    try:
        with open(argv[1], "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise PluginError("invalid_request", f"input is larger than {MAX_INPUT_BYTES} bytes")
        doc = json.loads(data)
        plugin = load(redactor)
    except OSError as exc:
        plugin = PluginError("invalid_request", f"cannot read the input file: {exc.strerror}")
    except ValueError:
        plugin = PluginError("invalid_request", "the input file is not JSON")
    except PluginError as err:
        plugin = err
    ok, body = run_action(plugin, redactor, action, doc)
    text = json.dumps(body if ok else {"error": body})
    sys.stdout.write(redactor.scrub(text, join_tokens(doc)) + "\n")
    sys.stdout.flush()
    return 0 if ok else 1
