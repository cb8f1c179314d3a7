"""Persistent transport: one long-lived process, JSON lines in both directions.

stdin carries ``{"id", "action", "input"}`` lines; stdout gets ``{"id", "result"}`` or ``{"id", "error"}`` lines in
completion order, many requests in flight (boto3 calls run in worker threads through ``trio.to_thread``, at most
``MAX_IN_FLIGHT`` at once; one boto3 client is shared, which botocore supports). EOF on stdin: finish what is in
flight, then exit. A line that is not a request object is answered with ``"id": null`` and ``invalid_request``.
"""

from __future__ import annotations

import json
import logging

import trio

from aws_ec2_plugin.calls import MAX_INPUT_BYTES, join_tokens, load, run_action, setup_logging
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.plugin import Plugin
from aws_ec2_plugin.redact import Redactor

MAX_IN_FLIGHT = 8


def main() -> int:
    redactor = Redactor.from_environment()
    setup_logging(redactor)
    plugin = load(redactor)
    trio.run(_serve, plugin, redactor)
    return 0


async def _serve(plugin: Plugin | PluginError, redactor: Redactor) -> None:
    stdin = trio.lowlevel.FdStream(0)
    stdout = trio.lowlevel.FdStream(1)
    write_lock = trio.Lock()
    limiter = trio.CapacityLimiter(MAX_IN_FLIGHT)

    async def answer(line: bytes) -> None:
        request_id, action, doc = None, "", None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
            request_id, action, doc = request.get("id"), request.get("action"), request.get("input")
            if not isinstance(action, str):
                raise ValueError("no action")
        except ValueError:
            ok, body = (
                False,
                {
                    "code": "invalid_request",
                    "retryable": False,
                    "message": "a request line must be a JSON object with id, action and input",
                },
            )
        else:
            ok, body = await trio.to_thread.run_sync(run_action, plugin, redactor, action, doc, limiter=limiter)
        reply = {"id": request_id, "result" if ok else "error": body}
        text = redactor.scrub(json.dumps(reply), join_tokens(doc)) + "\n"
        async with write_lock:
            await stdout.send_all(text.encode())

    async with trio.open_nursery() as nursery:
        buffer = bytearray()
        discarding = False  # inside an over-long line: drop bytes up to its newline
        while chunk := await stdin.receive_some(1 << 16):
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                if discarding:
                    discarding = False
                elif line.strip():
                    nursery.start_soon(answer, line)
            if len(buffer) > MAX_INPUT_BYTES:
                logging.getLogger(__name__).error("dropping a request line longer than %d bytes", MAX_INPUT_BYTES)
                buffer.clear()
                discarding = True
        if buffer.strip() and not discarding:
            nursery.start_soon(answer, bytes(buffer))
