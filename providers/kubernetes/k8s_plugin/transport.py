"""Both transports over one ``Plugin.handle``: one-shot (``<action>.sh -f in.json``) and persistent JSON lines.

Whatever happens, a call ends as a result or an error document (a bug becomes ``provider_error``, never a
traceback on stdout). Everything written is scrubbed of the call's join tokens; stderr gets one JSON line per call
(action, outcome, milliseconds, op_id, the error message), never inputs or outputs.

Persistent: requests run in a thread pool (``MAX_IN_FLIGHT``), answered in completion order; EOF on stdin finishes
what is in flight, then exits. A line that is not a request object gets ``"id": null`` and ``invalid_request``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from k8s_plugin.errors import PluginError

MAX_INPUT_BYTES = 8 << 20
MAX_IN_FLIGHT = 8
log = logging.getLogger("k8s_plugin")


def join_tokens(doc: Any) -> list[str]:
    boot = doc.get("bootstrap") if isinstance(doc, dict) else None
    if not isinstance(boot, list):
        return []
    return [b["joinToken"] for b in boot if isinstance(b, dict) and isinstance(b.get("joinToken"), str)]


def scrub(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 6 and secret in text:
            text = text.replace(secret, "[REDACTED]")
    return text


def run_action(load: Any, action: str, doc: Any) -> tuple[bool, dict[str, Any]]:
    """``(ok, result or error body)``; never raises. ``load`` is the plugin, or the ``PluginError`` that stopped it
    from loading (a bad configuration answers every call with that error)."""
    started = time.monotonic()
    try:
        if isinstance(load, PluginError):
            raise load
        ok, body, outcome = True, load.handle(action, doc), "ok"
    except PluginError as err:
        ok, body, outcome = False, err.document(), err.code
    except Exception as exc:  # noqa: BLE001 - a bug must still answer with an error document
        ok, body, outcome = (
            False,
            {"code": "provider_error", "retryable": False, "message": f"internal error: {type(exc).__name__}"},
            "internal_error",
        )
        log.error("internal error in %s:\n%s", action, scrub(traceback.format_exc(), join_tokens(doc)))
    event: dict[str, Any] = {"action": action, "outcome": outcome, "ms": round((time.monotonic() - started) * 1000, 1)}
    if isinstance(doc, dict) and isinstance(doc.get("op_id"), str):
        event["op_id"] = doc["op_id"][:64]
    if not ok:
        body["message"] = scrub(str(body["message"]), join_tokens(doc))
        event["message"] = body["message"]
    log.info("%s", json.dumps(event))
    return ok, body


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("k8s-plugin %(levelname)s %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)


def oneshot(load: Any, action: str, argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "-f":
        doc: Any = None
        ok, body = False, PluginError("invalid_request", "usage: <action>.sh -f <input.json>").document()
    else:
        try:
            with open(argv[1], "rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
            if len(data) > MAX_INPUT_BYTES:
                raise PluginError("invalid_request", f"the input is larger than {MAX_INPUT_BYTES} bytes")
            doc = json.loads(data)
        except OSError as exc:
            doc, load = None, PluginError("invalid_request", f"cannot read the input file: {exc.strerror}")
        except ValueError:
            doc, load = None, PluginError("invalid_request", "the input file is not JSON")
        except PluginError as err:
            doc, load = None, err
        ok, body = run_action(load, action, doc)
    sys.stdout.write(scrub(json.dumps(body if ok else {"error": body}), join_tokens(doc)) + "\n")
    sys.stdout.flush()
    return 0 if ok else 1


def persistent(load: Any) -> int:
    lock = threading.Lock()
    out = sys.stdout

    def answer(line: bytes) -> None:
        request_id, doc = None, None
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or not isinstance(request.get("action"), str):
                raise ValueError("not a request")
            request_id, action, doc = request.get("id"), request["action"], request.get("input")
        except ValueError:
            ok, body = (
                False,
                PluginError(
                    "invalid_request", "a request line must be a JSON object with id, action and input"
                ).document(),
            )
        else:
            ok, body = run_action(load, action, doc)
        text = scrub(json.dumps({"id": request_id, "result" if ok else "error": body}), join_tokens(doc)) + "\n"
        with lock:
            out.write(text)
            out.flush()

    stdin = sys.stdin.buffer
    with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="call") as pool:
        while True:
            line = stdin.readline(MAX_INPUT_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_INPUT_BYTES and not line.endswith(b"\n"):
                log.error("dropping a request line longer than %d bytes", MAX_INPUT_BYTES)
                while (rest := stdin.readline(1 << 16)) and not rest.endswith(b"\n"):
                    pass
                continue
            if line.strip():
                pool.submit(answer, line)
    return 0
