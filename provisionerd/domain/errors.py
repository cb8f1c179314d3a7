"""The typed error hierarchy. Every failure that crosses a module boundary is one of these.

Callers decide what to do next from the *type* (and, for provider rejections, the ``code``), never from the text.
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
    ├── LinkDown               the controller link is down or broke mid-request (outcome unknown)
    ├── LeaseError             no valid lease for a provider (never acquired, lapsed, lost)
    └── ProviderError          a provider plugin call failed
        ├── ProviderTimeout    the call exceeded its deadline; the process group was killed
        ├── ProviderCrashed    the plugin exited/died before answering
        ├── ProviderProtocolViolation   output that is not JSON, too large, or fails the schema
        ├── ProviderRejected   the plugin answered with a typed error document (``code``, ``retryable``)
        │   └── ProviderInputInvalid    the daemon's own input failed the schema; nothing was sent (invalid_request)
        ├── ProviderOutcomeUnknown      a retry refused: an earlier attempt's outcome is unknown (legacy plugins)
        └── ProviderUnsupported         the plugin does not implement the action (e.g. no ``<action>.sh``)
"""

from __future__ import annotations

from collections.abc import Sequence


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
    ``no_lease``, ``invalid``, ``token_invalid``.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"controller rejected: {reason}" + (f" ({detail})" if detail else ""))


class LinkDown(ProvisionerdError):
    """The controller link is down, or broke (or a reply did not come in time) while a request was in flight.

    A request that fails this way has an unknown outcome: a fact may or may not have been committed.
    """


class LeaseError(ProvisionerdError):
    """No valid lease for the provider: never acquired, lapsed on the local clock, or lost."""

    def __init__(self, provider: str, detail: str) -> None:
        self.provider = provider
        super().__init__(f"no valid lease for provider {provider!r}: {detail}")


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


class ProviderTimeout(ProviderError):
    """The call exceeded its deadline; its whole process group was killed."""


class ProviderCrashed(ProviderError):
    """The plugin process exited or died before it answered."""


class ProviderProtocolViolation(ProviderError):
    """Output that is not JSON, exceeds the size caps, or fails the action's output schema."""


class ProviderRejected(ProviderError):
    """The plugin answered with a typed error document: the call was refused, its outcome is known."""

    outcome_unknown = False

    def __init__(self, provider: str, action: str, code: str, message: str) -> None:
        self.code = code if code in PROVIDER_ERROR_CODES else "provider_error"
        self.message = message
        super().__init__(provider, action, f"{self.code}: {message}")

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES


class ProviderInputInvalid(ProviderRejected):
    """The input failed the action's input schema, so nothing was sent: a daemon bug, never retryable.

    ``problems`` lists each one as ``"<json path>: <message>"`` (redacted of secrets).
    """

    def __init__(self, provider: str, action: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(provider, action, "invalid_request", "input fails the schema: " + "; ".join(self.problems))


class ProviderOutcomeUnknown(ProviderError):
    """A mutation was refused because an earlier attempt of the same op has an unknown outcome and the plugin
    cannot make a retry safe (a legacy LSF plugin: no op_id idempotency, no listing to look for what it made).
    Nothing ran now; whatever the earlier attempt created is invisible to the daemon. Never retry it."""


class ProviderUnsupported(ProviderError):
    """The plugin does not implement the action (a one-shot plugin without ``<action>.sh``). Nothing ran."""

    outcome_unknown = False
