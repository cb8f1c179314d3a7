"""The typed error hierarchy. Every failure that crosses a module boundary is one of these.

Callers decide what to do next from the *type*, never from the text.
Messages never carry credentials or join tokens: the code that raises is responsible for what it puts in.

    ProvisionerdError
    ├── ConfigError            bad config file or CLI value; carries every problem with its path
    ├── ProtocolError          a peer broke the wire protocol (the peer is dropped)
    │   ├── FrameTooLarge      length header above the limit (checked before the body is read)
    │   ├── TruncatedFrame     the stream ended inside a frame
    │   ├── DecodeError        the body is not a valid message
    │   ├── VersionMismatch    the peer speaks another protocol version
    │   └── OpcodeNotAllowed   the peer's role may not send this message
    ├── AuthError              TLS/certificate/token refusal
    ├── ControllerRejected     the controller answered with a typed rejection (stale_epoch, no_quorum, not_primary, ...)
    │   └── ControllerStorageFailure   storage_failure: it could not make the write durable (disk full); nothing
    │                              was committed, the link is kept: back off, call no provider for that intent
    ├── LinkDown               the controller link is down or broke mid-request (outcome unknown)
    ├── LeaseError             no valid lease for a provider (never acquired, lapsed, lost)
    └── ProviderError          a provider plugin call failed (``provisionerd.provider``)
        ├── OutcomeUnknown     the call's effect is unknown: it may or may not have happened (``outcome_unknown``)
        │   ├── ProviderTimeout    the call exceeded its deadline; the process group was killed
        │   ├── ProviderCrashed    the plugin exited/died before answering
        │   ├── ProviderProtocolViolation   output that is not JSON, too large, or fails the schema
        │   │   └── ProviderAnswerInvalid   an answer fails its schema: names the JSON path and the rule
        │   └── ProviderOutcomeUnknown      a retry refused: an earlier attempt's outcome is unknown (legacy plugins)
        ├── ProviderRejected   the plugin answered with a typed error document: nothing happened. One class per
        │   │                  ``code`` (``rejection(provider, action, code, message)`` picks it):
        │   ├── CapacityUnavailable     capacity_unavailable: none of this template now (retryable: later, elsewhere)
        │   ├── Throttled               throttled: the provider's rate limit (retryable: after a back-off)
        │   ├── QuotaExceeded           quota_exceeded: an account or template limit (pause the provider)
        │   ├── InvalidRequest          invalid_request: the input is wrong (a daemon bug or a reused op_id)
        │   │   └── ProviderInputInvalid    our own input failed the schema; nothing was sent
        │   ├── AuthFailed              auth_failed: the plugin's credentials were refused
        │   └── ProviderFailed          provider_error: anything else (and any code the contract does not know)
        └── ProviderUnsupported         the plugin does not implement the action (e.g. no ``<action>.sh``)

Provider errors carry what callers decide on, each in one place: the class (which refusal, or an unknown
outcome), ``code`` (the contract's code of a refusal, for events and facts), ``retryable`` (the contract's
retryable codes) and ``outcome_unknown`` (may the call have taken effect?). ``outcome_unknown`` is true for every
``OutcomeUnknown`` except a ``ProviderCrashed`` the runtime knows was never sent (a persistent plugin that was not
running): decide "did it happen?" on the flag, "what kind of failure?" on the class. The contract has no "not
found" refusal: an unknown request id is a ``complete_with_error`` status, and returning a machine that is gone
is harmless by contract, so there is no ``NotFound``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


class ProvisionerdError(Exception):
    """Base of every error this project raises on purpose."""


# --- configuration -------------------------------------------------------------------------------------------


class ConfigError(ProvisionerdError):
    """A config document or CLI value is invalid. ``problems`` lists each one as ``"<path>: <message>"``."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        self.problems = tuple(problems)
        detail = "".join(f"\n  {p}" for p in self.problems)
        super().__init__(f"{message}{detail}")


# --- wire ------------------------------------------------------------------------------------------------------


class ProtocolError(ProvisionerdError):
    """The peer broke the wire protocol. The connection is dropped; the server keeps serving others."""


class FrameTooLarge(ProtocolError):
    def __init__(self, length: int, limit: int) -> None:
        self.length = length
        self.limit = limit
        super().__init__(f"frame body of {length} bytes exceeds the limit of {limit} bytes")


class TruncatedFrame(ProtocolError):
    """The stream ended in the middle of a frame header or body."""


class DecodeError(ProtocolError):
    """The frame body is not a valid message of the schema."""


class FrameOverBounds(DecodeError):
    """A frame holds a list longer than its field allows, or more elements in all than its kind allows. Raised on
    a list's length, before any of its elements is read (``provisionerd.wire.bounds``)."""


class BuffersExhausted(ProtocolError):
    """Receiving more would take the bytes buffered across all connections past their cap: this peer is dropped
    (``provisionerd.wire.framing.BufferPool``)."""


class VersionMismatch(ProtocolError):
    def __init__(self, ours: int, theirs: int) -> None:
        self.ours = ours
        self.theirs = theirs
        super().__init__(f"protocol version mismatch: we speak {ours}, the peer speaks {theirs}")


class OpcodeNotAllowed(ProtocolError):
    def __init__(self, role: str, opcode: str) -> None:
        self.role = role
        self.opcode = opcode
        super().__init__(f"role {role!r} may not send {opcode!r}")


class AuthError(ProvisionerdError):
    """A certificate, role or join token was refused."""


# --- controller ------------------------------------------------------------------------------------------------


class ControllerRejected(ProvisionerdError):
    """The controller answered a request with a typed rejection.

    ``reason`` is one of the wire's rejection codes: ``stale_epoch``, ``no_quorum``, ``not_primary``,
    ``no_lease``, ``invalid``, ``token_invalid``, ``storage_failure``. Build one from a reply with
    :func:`controller_rejection`, which picks the subclass.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"controller rejected: {reason}" + (f" ({detail})" if detail else ""))


class ControllerStorageFailure(ControllerRejected):
    """``storage_failure``: every check passed but the controller could not make the write durable (its disk is
    full, an I/O error). Nothing was committed and the controller's state did not change; the link stays up. The
    request is not in the log: an intent refused this way gets no provider call, and is planned again after the
    intent back-off (``planner.state.BACKOFF_CODES``)."""

    REASON: ClassVar[str] = "storage_failure"

    def __init__(self, detail: str = "") -> None:
        super().__init__(self.REASON, detail)


def controller_rejection(reason: str, detail: str = "") -> ControllerRejected:
    """The typed error of a ``Rejected{reason, detail}`` reply: the one place that maps a reason to its class."""
    if reason == ControllerStorageFailure.REASON:
        return ControllerStorageFailure(detail)
    return ControllerRejected(reason, detail)


class LinkDown(ProvisionerdError):
    """The controller link is down, or broke (or a reply did not come in time) while a request was in flight.

    A request that fails this way has an unknown outcome: a fact may or may not have been committed.
    """


class LeaseError(ProvisionerdError):
    """No valid lease for the provider: never acquired, lapsed on the local clock, or lost."""

    def __init__(self, provider: str, detail: str) -> None:
        self.provider = provider
        super().__init__(f"no valid lease for provider {provider!r}: {detail}")


class MutationsHalted(LeaseError):
    """Every mutation is stopped: the controller forgot what it acknowledged (another incarnation, a lower last
    index, an epoch granted again) and an admin has not accepted the reset yet (DESIGN invariant 9).

    A ``LeaseError``, so that every caller that handles "no valid lease" (no call, try again later) handles this too.
    """

    def __init__(self, provider: str, detail: str) -> None:
        self.provider = provider
        self.detail = detail
        ProvisionerdError.__init__(self, f"mutations halted for provider {provider!r}: {detail}")


class StateFileDamaged(ConfigError):
    """The daemon's state file (what it remembers of the controller) cannot be read or makes no sense. The daemon
    refuses to start on it, as on a bad config: silently starting afresh would forget what amnesia detection needs.
    ``path`` names the file."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(
            f"state file {path!r} is damaged: {detail} (remove it only to start with no memory of the controller)"
        )


class InsecurePath(ProvisionerdError):
    """A directory the daemon must trust (the admin socket's, or one of its ancestors) could be changed by another
    user: writable by group or others, or owned by someone else. The daemon refuses to start on it (exit 2): a
    local user could replace the socket with a fake one that ``provisionerd status`` and ``orphans return``
    would believe. ``path`` names it, ``reason`` says what is wrong."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"insecure path {path!r}: {reason}")


# --- providers -------------------------------------------------------------------------------------------------

#: Codes a provider may put in its error document. The first two are retryable by definition.
PROVIDER_ERROR_CODES = (
    "capacity_unavailable",
    "throttled",
    "quota_exceeded",
    "invalid_request",
    "auth_failed",
    "provider_error",
)
RETRYABLE_CODES = frozenset({"capacity_unavailable", "throttled"})


class ProviderError(ProvisionerdError):
    """A provider call failed. ``action`` names the contract action, ``provider`` the configured provider."""

    def __init__(self, provider: str, action: str, detail: str) -> None:
        self.provider = provider
        self.action = action
        self.detail = detail
        super().__init__(f"provider {provider!r} {action}: {detail}")

    #: Whether the call's effect is unknown (it may or may not have happened). Only mutations care.
    outcome_unknown = True


# --- provider: the effect is unknown ----------------------------------------------------------------------------


class OutcomeUnknown(ProviderError):
    """The call may or may not have taken effect: a mutation's result must be looked for (the op's listing) before
    anything is retried, and only an idempotent provider may get the same op_id again."""

    outcome_unknown = True


class ProviderTimeout(OutcomeUnknown):
    """The call exceeded its deadline; its whole process group was killed."""


class ProviderCrashed(OutcomeUnknown):
    """The plugin process exited or died before it answered."""


class ProviderProtocolViolation(OutcomeUnknown):
    """Output that is not JSON, exceeds the size caps, or fails the action's output schema."""


#: At most this many characters of ``ProviderAnswerInvalid``'s problems go into its message.
_MAX_ANSWER_DETAIL = 600


class ProviderAnswerInvalid(ProviderProtocolViolation):
    """A plugin's answer is JSON but fails its action's output schema (or a reader's rule past it).

    ``path`` is the JSON path of the first value refused (``$.requests[0].machines[3].result``), ``rule`` the rule
    it breaks (``enum: must be one of ["executing", "succeed", "fail"]``), ``problems`` every ``(path, rule)`` found
    (bounded by the finder). Built from the schema, never from the answer: no value a plugin sent is repeated (it
    may be a credential), only where it is and what it should have been."""

    def __init__(self, provider: str, action: str, problems: Sequence[tuple[str, str]]) -> None:
        if not problems:
            raise ValueError("ProviderAnswerInvalid needs at least one (path, rule)")
        self.problems = tuple(problems)
        self.path, self.rule = self.problems[0]
        shown = "; ".join(f"{path}: {rule}" for path, rule in self.problems[:3])
        if len(shown) > _MAX_ANSWER_DETAIL:
            shown = shown[: _MAX_ANSWER_DETAIL - 3] + "..."
        more = len(self.problems) - 3
        super().__init__(provider, action, f"answer refused at {shown}" + (f" (and {more} more)" if more > 0 else ""))


class ProviderOutcomeUnknown(OutcomeUnknown):
    """A mutation was refused because an earlier attempt of the same op has an unknown outcome and the plugin
    cannot make a retry safe (a legacy LSF plugin: no op_id idempotency, no listing to look for what it made).
    Nothing ran now; whatever the earlier attempt created is invisible to the daemon. Never retry it."""


# --- provider: refused, nothing happened ------------------------------------------------------------------------


class _ByCode(type):
    """The metaclass of ``ProviderRejected``: calling the base class itself, ``ProviderRejected(provider, action,
    code, message)``, builds the subclass for ``code`` (``rejection``), as ``OSError(errno.ENOENT, ...)`` builds a
    ``FileNotFoundError``. So no refusal exists whose class does not say its code, whoever raised it."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is ProviderRejected:
            return rejection(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class ProviderRejected(ProviderError, metaclass=_ByCode):
    """The plugin answered with a typed error document: the call was refused, its outcome is known.

    Each subclass is one ``code`` of the contract (``PROVIDER_ERROR_CODES``); build one with ``rejection`` when
    the code is data (an error document), or with the subclass (``Throttled(provider, action, message)``) when
    the raiser knows it. ``message`` is the plugin's text, redacted, for operators only: never decide on it.
    """

    code: ClassVar[str]
    retryable: ClassVar[bool] = False
    outcome_unknown = False

    def __init__(self, provider: str, action: str, message: str) -> None:
        self.message = message
        super().__init__(provider, action, f"{self.code}: {message}")


class CapacityUnavailable(ProviderRejected):
    """``capacity_unavailable``: the provider has no capacity for this template now. Retryable: later, or with
    another offer."""

    code = "capacity_unavailable"
    retryable = True


class Throttled(ProviderRejected):
    """``throttled``: the provider's API rate limit. Retryable after a back-off."""

    code = "throttled"
    retryable = True


class QuotaExceeded(ProviderRejected):
    """``quota_exceeded``: an account or template limit. Not retryable until the limit changes."""

    code = "quota_exceeded"


class InvalidRequest(ProviderRejected):
    """``invalid_request``: the input is wrong (unknown template, bad field, an op_id reused for another ask)."""

    code = "invalid_request"


class ProviderInputInvalid(InvalidRequest):
    """The input failed the action's input schema, so nothing was sent: a daemon bug, never retryable.

    ``problems`` lists each one as ``"<json path>: <message>"`` (redacted of secrets).
    """

    def __init__(self, provider: str, action: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(provider, action, "input fails the schema: " + "; ".join(self.problems))


class AuthFailed(ProviderRejected):
    """``auth_failed``: the plugin's credentials were refused."""

    code = "auth_failed"


class ProviderFailed(ProviderRejected):
    """``provider_error``: anything else the plugin could not do (its config is broken, its API failed), and every
    code the contract does not define. The plugin may not know whether a mutation took effect (the contract tells
    it to answer this code then), so a caller that can look (the op's listing) does."""

    code = "provider_error"


#: The refusal class of each contract code.
REJECTIONS: Mapping[str, type[ProviderRejected]] = {
    cls.code: cls for cls in (CapacityUnavailable, Throttled, QuotaExceeded, InvalidRequest, AuthFailed, ProviderFailed)
}


def rejection(provider: str, action: str, code: str, message: str) -> ProviderRejected:
    """The refusal ``code`` stands for: the one place an error code becomes an exception (a code the contract does
    not know is ``ProviderFailed``, code ``provider_error``)."""
    return REJECTIONS.get(code, ProviderFailed)(provider, action, message)


# --- provider: nothing ran ----------------------------------------------------------------------------------------


class ProviderUnsupported(ProviderError):
    """The plugin does not implement the action (a one-shot plugin without ``<action>.sh``). Nothing ran."""

    outcome_unknown = False


#: What an exception that carries no message of its own means, by class name (trio's and the standard library's;
#: named, not imported, so this module stays below every I/O layer).
_WITHOUT_MESSAGE = {
    "BrokenResourceError": "the connection was broken by the peer or the network",
    "ClosedResourceError": "the stream was already closed on this side",
    "EndOfChannel": "the other side closed the channel",
    "TooSlowError": "timed out",
    "TimeoutError": "timed out",
    "ConnectionResetError": "connection reset by the peer",
    "ConnectionRefusedError": "connection refused",
    "SSLEOFError": "the TLS peer closed the connection without a close_notify",
    "EOFError": "the stream ended",
}


def describe_error(exc: BaseException) -> str:
    """``"ClassName: what happened"`` for a log line or a status field, never an empty message.

    An exception without a message of its own is described by its cause (``raise ... from``) or the exception it
    was raised while handling, else by what its class means (``BrokenResourceError: the connection was broken by
    the peer or the network``), else ``no detail given``."""
    seen: set[int] = set()
    text = str(exc).strip()
    inner: BaseException | None = exc
    while not text and inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        inner = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
        if inner is not None:
            text = str(inner).strip()
            if text:
                text = f"{type(inner).__name__}: {text}"
    if not text:
        text = _WITHOUT_MESSAGE.get(type(exc).__name__, "no detail given")
    return f"{type(exc).__name__}: {text}"
