"""The plugin's one error type: a contract error code, a message free of secrets, and whether a retry may help.

The daemon decides retries from the code alone (``provisionerd.provider.runtime.rejection``): only
``capacity_unavailable`` and ``throttled`` are retried. So every transient Slurm failure (slurmctld unreachable or
slow, munged down, "temporarily unable to accept job") is reported as ``throttled``: back off and call again. A
``provider_error`` would be final, which is wrong for a controller that is merely restarting.
"""

from __future__ import annotations

RETRYABLE = frozenset({"capacity_unavailable", "throttled"})


class PluginError(Exception):
    """A failure with a contract error code. ``message`` must already be free of secrets where it is raised."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE

    def document(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}
