"""TEST ONLY: fault injection and a call log through botocore event hooks, configured by ``fault_injection``.

The EC2 emulator (moto) never runs out of capacity, never throttles and has no quotas, and a test cannot make the
plugin lose a response from outside the plugin's process. These hooks live inside the process, so boto3 sees the
same thing it would see from AWS: ``before-send`` returns an EC2 error response (botocore parses it and raises a
real ``ClientError``), ``after-call`` can kill the process after the emulator has acted (an outcome unknown to the
caller), and ``before-parameter-build`` appends the operation name and the number of instance ids (or CreateTags
resources) to a log file, never the parameters (UserData carries join tokens).

Counters are per process: a one-shot call is one process, so ``skip``/``times`` count within one action. A fault
with ``match`` fires only on calls whose request parameters (EC2's query form: ``InstanceType``, ``SubnetId``) have
the given values, and counts only those: "InsufficientInstanceCapacity for c5.xlarge, whatever else succeeds".
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape

from botocore.awsrequest import AWSResponse

CRASH_EXIT_CODE = 70


class _Body:
    """The raw-response shape botocore reads an injected body from."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body


class _Fault:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.seen = 0
        self.fired = 0
        self.lock = threading.Lock()

    def should_fire(self) -> bool:
        with self.lock:
            self.seen += 1
            if self.seen <= self.spec.get("skip", 0):
                return False
            times = self.spec.get("times")
            if times is not None and self.fired >= times:
                return False
            self.fired += 1
            return True


def install(events: Any, spec: Mapping[str, Any]) -> None:
    """Register the hooks described by ``spec`` (the config's ``fault_injection``) on a client's event system."""
    call_log = spec.get("call_log")
    if call_log:
        events.register("before-parameter-build.ec2", _call_logger(call_log))
    for raw in spec.get("faults", ()):
        fault = _Fault(raw)
        if raw["action"] == "error":
            events.register(f"before-send.ec2.{raw['operation']}", _error_responder(fault))
        else:
            events.register(f"after-call.ec2.{raw['operation']}", _crasher(fault))


def _call_logger(path: str) -> Any:
    def log_call(model: Any, params: Mapping[str, Any], **_: Any) -> None:
        ids = params.get("InstanceIds") or params.get("Resources") or ()
        entry = {"op": model.name, "ids": len(ids)}
        if model.name == "RunInstances":  # how many, of which type: never the user-data
            entry.update(count=params.get("MaxCount"), instance_type=params.get("InstanceType"))
        if "MaxResults" in params:  # EC2's own paging, as listMachines pages use it
            entry.update(max_results=params["MaxResults"], token=bool(params.get("NextToken")))
        line = json.dumps(entry) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    return log_call


def _error_responder(fault: _Fault) -> Any:
    spec = fault.spec
    code = escape(spec.get("code", "InternalError"))
    message = escape(spec.get("message", "injected fault (test only)"))
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestID>injected-fault</RequestID></Response>"
    ).encode()

    match = spec.get("match") or {}

    def respond(request: Any, **_: Any) -> AWSResponse | None:
        if match and not _matches(request.body, match):
            return None
        if not fault.should_fire():
            return None
        return AWSResponse(request.url, spec.get("http_status", 400), {}, _Body(body))

    return respond


def _matches(body: Any, match: Mapping[str, str]) -> bool:
    """Whether a serialised EC2 request (the query string botocore sends) has every ``match`` parameter."""
    text = body.decode() if isinstance(body, bytes) else str(body or "")
    params = urllib.parse.parse_qs(text)
    return all(value in params.get(key, ()) for key, value in match.items())


def _crasher(fault: _Fault) -> Any:
    def crash(**_: Any) -> None:
        if fault.should_fire():
            # The emulator has acted; the caller never hears about it: an unknown outcome, like a killed plugin.
            os._exit(CRASH_EXIT_CODE)

    return crash
