"""The persistent transport: one long-lived process, JSON lines on stdin and stdout.

stdin carries ``{"id", "action", "input"}`` lines; stdout gets ``{"id", "result"}`` or ``{"id", "error"}`` lines.
With ``max_in_flight`` above 1, calls run in a pool of that many threads and are answered in completion order (the
contract allows any order); with 1, each line is answered before the next is read. A line that is not a request
object is answered with ``"id": null`` and ``invalid_request``; a line longer than ``max_line`` is dropped (logged).
EOF on stdin: finish what is in flight, then return 0. Every answer is scrubbed of its call's join tokens.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from provisionerd.plugin_sdk.calls import Handler, Loaded, load_plugin, run_action
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.redact import Redactor, join_tokens

MAX_LINE = 8 << 20
MAX_IN_FLIGHT = 8
NOT_A_REQUEST = "a request line must be a JSON object with id, action and input"
log = logging.getLogger("provisionerd.plugin_sdk.lines")


def answer_line(load: Loaded, line: bytes, redactor: Redactor | None = None) -> bytes:
    """The answer line (with its newline) to one request line."""
    request_id, doc = None, None
    try:
        request = json.loads(line)
        if not isinstance(request, dict) or not isinstance(request.get("action"), str):
            raise ValueError("not a request")
        request_id, action, doc = request.get("id"), request["action"], request.get("input")
    except ValueError:
        ok, body = False, PluginError("invalid_request", NOT_A_REQUEST).document()
    else:
        ok, body = run_action(load, action, doc, redactor)
    text = json.dumps({"id": request_id, "result" if ok else "error": body})
    return ((redactor or Redactor()).scrub(text, join_tokens(doc)) + "\n").encode()


def _lines(stdin: IO[bytes], max_line: int) -> Iterator[bytes]:
    """The non-blank lines of ``stdin``, without those longer than ``max_line``."""
    while line := stdin.readline(max_line + 1):
        if len(line) > max_line and not line.endswith(b"\n"):
            log.error("dropping a request line longer than %d bytes", max_line)
            while (rest := stdin.readline(1 << 16)) and not rest.endswith(b"\n"):
                pass
            continue
        if line.strip():
            yield line


def serve_lines(
    factory: Callable[[], Handler],
    redactor: Redactor | None = None,
    *,
    max_in_flight: int = MAX_IN_FLIGHT,
    max_line: int = MAX_LINE,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
) -> int:
    """Make the plugin once (``factory()``; a ``PluginError`` answers every call) and answer requests until EOF.
    Returns the exit status, 0."""
    load = load_plugin(factory)
    source = stdin or sys.stdin.buffer
    sink = stdout or sys.stdout.buffer
    lock = threading.Lock()

    def answer(line: bytes) -> None:
        text = answer_line(load, line, redactor)
        with lock:
            sink.write(text)
            sink.flush()

    if max_in_flight <= 1:
        for line in _lines(source, max_line):
            answer(line)
        return 0
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="call") as pool:
        for line in _lines(source, max_line):
            pool.submit(answer, line)
    return 0
