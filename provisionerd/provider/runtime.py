"""What both transports share: the transport interface (``PluginTransport``), the plugin's config and environment,
redaction of secrets, and the checks every call goes through (input before sending, output on arrival).

This is the raw level: documents in, documents out. The one-shot and persistent transports, the legacy LSF adapter,
the in-memory fakes and the conformance kit speak it. The daemon speaks the typed level above it
(``provisionerd.provider.client``: ``ProviderClient``, one method per action, values in and out).

A call's life, whatever the transport::

    input ──validate (ProviderInputInvalid, nothing sent)──> plugin ──stdout──> decode JSON ──validate──> dict
                                                              │ no answer in time: ProviderTimeout
                                                              │ died/killed: ProviderCrashed
                                                              │ not JSON/too big/bad shape: ProviderProtocolViolation
                                                              └ error document: its code's ProviderRejected subclass
                                                                (read_error_body -> domain.errors.rejection)

Every text that reaches an error comes through a ``Redactor`` holding the configured credential values and the
join tokens of the input: plugins echo their input and environment in tracebacks, and we quote their output.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import msgspec

from provisionerd.domain.errors import (
    RETRYABLE_CODES,
    ProviderAnswerInvalid,
    ProviderInputInvalid,
    ProviderRejected,
    rejection,
)
from provisionerd.provider.schemas import ACTIONS, contract
from provisionerd.telemetry.redaction import Redactor

log = logging.getLogger(__name__)

#: Seconds a call may take before its plugin is killed; per action, overridable in ``ProviderConfig.timeouts``.
DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "describeProvider": 30.0,
    "getAvailableTemplates": 60.0,
    "getRequestStatus": 60.0,
    "getReturnRequests": 60.0,
    "listMachines": 120.0,
    "requestMachines": 180.0,
    "requestReturnMachines": 120.0,
    "stopMachines": 120.0,
    "listLicenses": 60.0,
    "returnLicenses": 60.0,
}
#: Variables of the daemon's own environment a plugin inherits; nothing else leaks from the daemon.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_SNIPPET = 200


@attrs.frozen
class Limits:
    """Bounds on what one plugin can make the daemon hold or wait for."""

    max_output: int = 8 << 20  # one-shot stdout bytes
    max_line: int = 8 << 20  # persistent: bytes of one JSON line
    stderr_tail: int = 8 << 10  # the last characters of stderr kept (redacted) for error details
    term_grace: float = 1.0  # seconds between SIGTERM and SIGKILL of the process group
    max_in_flight: int = 1024  # persistent: calls waiting for an answer at once (more wait their turn)


@attrs.frozen
class ProviderConfig:
    """One configured provider plugin.

    ``path`` is the directory of ``<action>.sh`` scripts (one-shot) or the executable (persistent), started with
    ``args`` after it. ``env`` adds plain variables; ``credentials`` adds secret ones: both reach only the plugin's
    environment, and the credential values are redacted from everything the runtime reports.
    """

    name: str
    cluster: str
    path: str
    transport: str = "oneshot"
    args: tuple[str, ...] = ()
    conf_dir: str = ""
    data_dir: str = ""
    #: Where the one-shot transport keeps each call's directory (``provider.calls``; the daemon's
    #: ``<state_dir>/calls/<name>``). Empty: temporary directories, and a call's result dies with the daemon.
    calls_dir: str = ""
    log_dir: str = ""
    lsf_top: str = ""
    env: Mapping[str, str] = attrs.field(factory=dict)
    credentials: Mapping[str, str] = attrs.field(factory=dict, repr=lambda _: "{...}")
    timeouts: Mapping[str, float] = attrs.field(factory=dict)
    limits: Limits = Limits()

    def timeout_for(self, action: str) -> float:
        return float(self.timeouts.get(action, DEFAULT_TIMEOUTS.get(action, 60.0)))

    def plugin_env(self) -> dict[str, str]:
        """The plugin's whole environment (LSF resource connector names, plus ours)."""
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env.update(
            PROVIDER_NAME=self.name,
            PRO_CONF_DIR=self.conf_dir,
            PRO_DATA_DIR=self.data_dir,
            PRO_LSF_LOGDIR=self.log_dir or self.data_dir,
            PRO_LSF_TOP=self.lsf_top,
            PROVISIONERD_CLUSTER=self.cluster,
            PROVISIONERD_PYTHON=sys.executable,
        )
        env.update(self.env)
        env.update(self.credentials)
        return env


class PluginTransport(Protocol):
    """A provider plugin's raw calls, behind either transport (or the legacy adapter, or an in-memory fake).

    ``call`` validates ``input`` against the action's input schema, runs the action within ``timeout`` seconds
    (default: the config's per-action timeout) and returns the validated output document. It raises only
    ``ProviderError`` subclasses: ``ProviderInputInvalid`` (nothing sent), ``ProviderUnsupported``,
    ``ProviderTimeout``, ``ProviderCrashed``, ``ProviderProtocolViolation`` or a ``ProviderRejected`` subclass.

    Why ``timeout`` is a parameter, not the caller's cancel scope (ruff's ASYNC109): the deadline is the plugin's.
    When it passes, the transport kills the plugin's whole process group and raises ``ProviderTimeout`` (outcome
    unknown; a persistent plugin is restarted); a caller's cancel scope could only abandon the call and leave the
    action running. The persistent transport also keeps all its calls' deadlines in one watchdog per process,
    much cheaper than a cancel scope per call. The typed client passes it down unchanged.
    """

    @property
    def name(self) -> str: ...

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]: ...  # noqa: ASYNC109

    async def aclose(self) -> None: ...


def redactor_for(config: ProviderConfig) -> Redactor:
    return Redactor().including(config.credentials.values())


def join_tokens(action: str, document: Mapping[str, Any]) -> list[str]:
    """The secrets an input carries (the bootstrap join tokens of ``requestMachines``)."""
    if action != "requestMachines":
        return []
    bootstrap = document.get("bootstrap")
    if not isinstance(bootstrap, list):
        return []
    return [b["joinToken"] for b in bootstrap if isinstance(b, dict) and isinstance(b.get("joinToken"), str)]


def snippet(text: str | bytes, redact: Redactor, limit: int = _SNIPPET) -> str:
    """A short, redacted, printable quote of plugin output for an error detail."""
    if isinstance(text, bytes):
        # Redact, then truncate: decode enough beyond the quoted part that a secret starting in it is whole.
        text = text[: limit * 4 + 4 * redact.reach].decode("utf-8", "replace")
    text = redact(text)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def check_input(
    provider: str, action: str, document: Mapping[str, Any], redact: Redactor, *, encoded: str | None = None
) -> None:
    """Raise ``ProviderInputInvalid`` (nothing is sent) unless ``document`` is a valid input of ``action``.
    ``encoded``: ``dump_json(document)``, the text to be sent, which the schemas check faster."""
    if action not in ACTIONS:
        raise ProviderInputInvalid(provider, action, [f"unknown action {action!r}"])
    problems = contract().input_problems(action, document, encoded=encoded)
    if problems:
        raise ProviderInputInvalid(provider, action, [redact(p) for p in problems])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.loads/dumps with non-default options build a new decoder/encoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


_FAST_DECODE: Callable[[bytes | str], Any] = msgspec.json.Decoder().decode


def parse_json(raw: bytes | str) -> Any:
    """Strict JSON (no NaN/Infinity, as the standard says). Raises ``ValueError``.

    msgspec's decoder first: it parses a plugin's answer in about a third of the standard decoder's time (a
    4-machine poll answer 3.9 us against 10.5 us; a listing page 1.2 against 2.1 us a machine, measured side by
    side in one process). It takes only what the standard decoder takes, giving the same value (the same types all the
    way down: integers of any size stay ``int``); what it refuses (a number out of a double's range, which the
    standard decoder reads as infinity, a lone surrogate escape, and everything that is not JSON) goes to the
    standard decoder, whose answer or error is then the one given. tests/provider/test_fast_paths.py compares the
    two on arbitrary text."""
    try:
        return _FAST_DECODE(raw)
    except msgspec.DecodeError:
        pass
    # What msgspec refused (rare: every well-formed plugin answer decodes above) is the standard decoder's to read.
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw  # UnicodeDecodeError is a ValueError
    return _DECODER.decode(text)


_FAST_ENCODE: Callable[[Any], bytes] = msgspec.json.Encoder().encode


def dump_json(document: Any) -> str:
    """Compact ASCII JSON (anything else escaped, as the standard encoder does); ``ValueError`` for NaN/Infinity (not
    JSON), ``TypeError`` for a value that is no JSON.

    msgspec's encoder first: a reclaim poll's 2,000-machine chunk in 0.49 ms with the check below, against 0.95 ms
    (a small input 0.31 against 1.39 us). msgspec also writes what is no JSON value, where the standard encoder
    refuses: a set as an array, bytes as base64, NaN as null, an attrs instance or a date. So its text is used only
    when it is ASCII (no DEL either) and decodes back to a value equal to ``document``; a set, bytes, NaN, a dict
    with keys that are not strings (or a tuple, which the standard encoder writes as an array) decode to something
    unequal and go to the standard encoder, whose answer or error is then the one given. Numbers may be spelt
    differently (``1e16`` for ``1e+16``), never valued differently. tests/provider/test_fast_paths.py compares the
    two on arbitrary values."""
    try:
        text = _FAST_ENCODE(document)
        # DEL is ASCII, but the standard encoder escapes it as it does every byte outside " " to "~".
        if b"\x7f" not in text and _FAST_DECODE(text) == document:
            return text.decode("ascii")  # UnicodeDecodeError (a ValueError) for any other text
    except (msgspec.MsgspecError, TypeError, ValueError, OverflowError, RecursionError):
        pass  # the standard encoder says what is wrong with it
    return _ENCODER.encode(document)


def check_output(
    provider: str, action: str, document: Any, redact: Redactor, *, parsed: bool = False
) -> dict[str, Any]:
    """The output document if valid for ``action``, else ``ProviderAnswerInvalid`` naming the JSON path and the
    rule of every problem (logged at WARNING: the first path and rule, never a value of the answer). ``parsed``:
    ``document`` is what ``parse_json`` returned (a transport's answer), which the schemas check faster."""
    problems = contract().output_violations(action, document, parsed=parsed)
    if problems:
        problems = [(redact(path), redact(rule)) for path, rule in problems]
        log.warning(
            "provider %s %s: answer refused at %s: %s (%d problem(s))",
            provider,
            action,
            problems[0][0],
            problems[0][1],
            len(problems),
        )
        raise ProviderAnswerInvalid(provider, action, problems)
    return document


def read_error_body(provider: str, action: str, body: Any, redact: Redactor) -> ProviderRejected | None:
    """The refusal an error body ``{"code", "message", "retryable"?}`` stands for (its code's ``ProviderRejected``
    subclass, ``domain.errors.rejection``); None if it is not a valid error body."""
    if contract().error_problems({"error": body}):
        return None
    error = rejection(provider, action, body["code"], redact(body["message"]))
    if "retryable" in body and body["retryable"] != (body["code"] in RETRYABLE_CODES):
        # The code decides retries (callers must not parse texts); a contradicting flag is only noted.
        error.add_note(f"the plugin said retryable={body['retryable']!r} for code {body['code']!r}")
    return error
