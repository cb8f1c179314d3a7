"""The plugin's one error type and the map from EC2/botocore failures to the contract's error codes.

Every failure leaves the plugin as an error document ``{"code", "message", "retryable"}``. The code decides what the
daemon does next, so the mapping is explicit and total: an EC2 error code we do not know becomes ``provider_error``
(retryable only for a 5xx), never a guess.

Retryable, and why:
- ``capacity_unavailable`` and ``throttled``: waiting (or another offering) fixes them; the contract says so.
- ``quota_exceeded``: no. A quota is raised by a human (Service Quotas); retrying only burns API budget.
- ``auth_failed`` and ``invalid_request``: no. The same call fails the same way until someone changes something.
- ``provider_error`` for an unreachable endpoint or a timeout: yes. A read timeout may hide a call that did
  happen, but every mutation is safe to repeat with the same op_id (tag lookup first, then ClientToken), so the
  daemon's retry is the right move.
- ``provider_error`` for an EC2 5xx (InternalError, Unavailable): yes; for anything else: no.

Messages are passed through :class:`aws_ec2_plugin.redact.Redactor` by the transport before they are written.
"""

from __future__ import annotations

import botocore.exceptions

from provisionerd.plugin_sdk import errors as sdk_errors

CAPACITY = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
    }
)
THROTTLED = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled", "ResourceCountExceeded"}
)
QUOTA = frozenset(
    {
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "ResourceLimitExceeded",
        "TagLimitExceeded",
    }
)
AUTH = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
        "OptInRequired",
        "Blocked",
        "PendingVerification",
        "AccessDenied",
        "AccessDeniedException",
    }
)
#: Invalid-request codes that the prefix rule below would not catch.
INVALID = frozenset(
    {"MissingParameter", "UnknownParameter", "Unsupported", "ValidationError", "IncorrectInstanceState"}
)
_INVALID_PREFIXES = ("Invalid", "Malformed", "Missing")

#: With the same ClientToken EC2 refuses different parameters; we only get here when an instance of this op_id
#: exists but is not visible yet (eventual consistency), so a later retry finds it by tag.
IDEMPOTENT_MISMATCH = "IdempotentParameterMismatch"


class PluginError(sdk_errors.PluginError):
    """The SDK's typed failure, with ``retryable`` as EC2 tells it (a 5xx ``provider_error`` is worth a retry)
    and EC2's own error code. ``message`` must already be free of secrets at the raise site."""

    def __init__(self, code: str, message: str, retryable: bool = False, aws_code: str | None = None) -> None:
        super().__init__(code, message, retryable=retryable)
        #: EC2's own error code when EC2 answered, for callers that treat one code specially (NotFound).
        self.aws_code = aws_code


def classify_aws_code(code: str, http_status: int) -> tuple[str, bool]:
    """``(contract code, retryable)`` for an EC2 error code and the HTTP status it came with."""
    if code in CAPACITY:
        return "capacity_unavailable", True
    if code in THROTTLED:
        return "throttled", True
    if code in QUOTA:
        return "quota_exceeded", False
    if code in AUTH:
        return "auth_failed", False
    if code == IDEMPOTENT_MISMATCH:
        return "provider_error", True
    if code in INVALID or code.startswith(_INVALID_PREFIXES):
        return "invalid_request", False
    return "provider_error", http_status >= 500


def from_exception(exc: BaseException, operation: str) -> PluginError:
    """Map what boto3/botocore raised during ``operation`` to a :class:`PluginError`.

    Only the error code, EC2's own message and the exception class name go into the message: botocore's
    exceptions never carry the secret key or session token, and the transport redacts the rest anyway.
    """
    if isinstance(exc, PluginError):
        return exc
    if isinstance(exc, sdk_errors.PluginError):  # a ConfigError
        return PluginError(exc.code, exc.message, exc.retryable)
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code") or "Unknown")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        contract_code, retryable = classify_aws_code(code, status)
        text = str(err.get("Message") or "")[:2000]
        return PluginError(contract_code, f"EC2 {operation} failed: {code}: {text}", retryable, aws_code=code)
    if isinstance(exc, (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)):
        return PluginError("auth_failed", f"EC2 {operation}: no usable AWS credentials in the standard chain")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return PluginError("provider_error", f"EC2 {operation}: no region configured")
    if isinstance(exc, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionClosedError)):
        return PluginError("provider_error", f"EC2 {operation}: endpoint unreachable ({type(exc).__name__})", True)
    if isinstance(exc, (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError)):
        return PluginError(
            "provider_error",
            f"EC2 {operation}: timed out ({type(exc).__name__}); the call may or may not have taken effect, "
            "a retry with the same op_id is safe",
            True,
        )
    if isinstance(exc, botocore.exceptions.HTTPClientError):
        return PluginError("provider_error", f"EC2 {operation}: HTTP failure ({type(exc).__name__})", True)
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        # Its text quotes parameter values (UserData carries join tokens): name the class only.
        return PluginError("invalid_request", f"EC2 {operation}: parameters refused by the client library")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return PluginError("provider_error", f"EC2 {operation}: {type(exc).__name__}")
    return PluginError("provider_error", f"EC2 {operation}: unexpected {type(exc).__name__}")
