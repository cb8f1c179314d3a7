"""Admin requests never raise out of the daemon: every refusal is typed, answered, logged and counted.

``AdminRefusals`` is the one place an admin request is refused: ``refuse(code, message)`` returns the reply
``{"ok": false, "refused": code, "error": message}``, logs it at WARNING (the code and the message, which never
carries a config value or a credential) and counts it by code (``counts``; ``status()`` shows them under
``admin``). ``guard(command)`` and ``guard_status(status)`` wrap what the admin socket runs, so an unexpected
exception in handling a request (a bug, a value the handler did not foresee) becomes the refusal
``internal_error`` naming the exception's type, instead of leaving the socket's task and taking the daemon's
nursery (and its leases) down with it.

The codes: ``bad_request`` (the request's fields), ``unknown_provider``, ``busy``, ``not_ready``,
``internal_error``, and the socket's own (``too_large``, ``not_json``, ``unknown_command``, ``no_request``,
``busy``) reported by the socket to this object (``serve_admin_socket(refusals=...)``: ``note``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from provisionerd.daemon.admin_socket import Command

log = logging.getLogger(__name__)

MAX_MESSAGE = 300


class AdminRefusals:
    """The refusals of one daemon's admin requests (module docstring)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def refuse(self, code: str, message: str, **extra: Any) -> dict[str, Any]:
        """Count and log the refusal ``code``; the reply to send."""
        self.note(code, message)
        return {"ok": False, "refused": code, "error": message[:MAX_MESSAGE], **extra}

    def note(self, code: str, message: str) -> None:
        """Count and log a refusal answered elsewhere (the socket's own)."""
        self.counts[code] += 1
        log.warning("admin request refused (%s): %s", code, message[:MAX_MESSAGE])

    def internal(self, what: str, exc: BaseException) -> dict[str, Any]:
        """The refusal for an unexpected exception while handling ``what``; logged with its traceback at ERROR."""
        log.error("admin %s failed unexpectedly: %s", what, type(exc).__name__, exc_info=exc)
        return self.refuse("internal_error", f"{what}: the daemon could not handle the request ({type(exc).__name__})")

    def guard(self, name: str, command: Command) -> Command:
        """``command`` with every exception of its run and its timeout turned into an ``internal_error`` refusal."""

        async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
            try:
                return await command.run(request, peer_uid)
            except Exception as exc:  # noqa: BLE001 - the point: nothing escapes to the daemon's nursery
                return self.internal(name, exc)

        def timeout(request: dict[str, Any]) -> float:
            try:
                return command.timeout(request)
            except Exception as exc:  # noqa: BLE001 - a bound it cannot compute is the default bound
                log.error("admin %s: no timeout for the request: %s", name, type(exc).__name__, exc_info=exc)
                return 5.0

        return Command(run=run, timeout=timeout)

    def guard_status(self, status: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        """``status`` that answers ``{"error": ...}`` instead of raising (the socket wraps it in ``ok``)."""

        def guarded() -> dict[str, Any]:
            try:
                return status()
            except Exception as exc:  # noqa: BLE001 - see guard
                return {"error": self.internal("status", exc)["error"]}

        return guarded

    def guard_prepare(self, prepare: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """``prepare`` (awaited before a ``status`` is read) with an unexpected exception logged and counted as an
        ``internal_error``: the status is then read as it stands."""

        async def guarded() -> None:
            try:
                await prepare()
            except Exception as exc:  # noqa: BLE001 - see guard
                self.internal("status", exc)

        return guarded

    def status(self) -> dict[str, Any]:
        return {"refusals": dict(sorted(self.counts.items()))}
