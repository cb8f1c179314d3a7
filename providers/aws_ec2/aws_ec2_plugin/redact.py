"""The AWS credentials the SDK's redactor (``provisionerd.plugin_sdk.redact``) scrubs from everything written.

Every string that leaves the process (stdout documents, stderr log lines) passes through ``Redactor.scrub`` with the
call's join tokens; this subclass adds the AWS credentials: those of the environment at start, and whatever boto3
resolved later (profile files, SSO, an instance role).
"""

from __future__ import annotations

from provisionerd.plugin_sdk import redact


class Redactor(redact.Redactor):
    #: The standard AWS chain's secret variables (the access key id is not secret, but it identifies the account's
    #: key pair, so it is scrubbed too).
    SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID")

    def add_credentials(self, credentials: object) -> None:
        """Add what boto3 resolved, not only what the environment held."""
        if credentials is None:
            return
        frozen = credentials.get_frozen_credentials()  # type: ignore[attr-defined]
        self.add([frozen.access_key or "", frozen.secret_key or "", frozen.token or ""])
