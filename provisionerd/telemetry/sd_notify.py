"""systemd's notify protocol (``sd_notify(3)``): one datagram to ``$NOTIFY_SOCKET``, no dependency.

``SdNotifier.from_env()`` reads ``NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace; anything else,
such as ``vsock:``, is not supported and disables the notifier with one warning) and ``WATCHDOG_USEC`` /
``WATCHDOG_PID`` (``watchdog_timeout``: seconds, or ``None`` when the watchdog is off or meant for another
process). Without ``NOTIFY_SOCKET`` (not started by systemd, or not ``Type=notify``) every ``send`` is a no-op.

``send("READY=1")`` never blocks and never raises: the socket is non-blocking, a full or vanished receiver costs
one warning per kind of failure and the message is dropped (systemd treats a missing ping as the watchdog's
business, which is the right outcome for a daemon that cannot reach its supervisor). The environment is left as
it is: the provider plugins get an environment of their own (``ProviderConfig.plugin_env``), without it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("provisionerd.sd_notify")


def socket_address(value: str) -> str | bytes | None:
    """The ``sendto`` address of a ``NOTIFY_SOCKET`` value: a path, abstract bytes for ``@name``, else ``None``."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    return None


def watchdog_timeout(env: Mapping[str, str], pid: int) -> float | None:
    """``WATCHDOG_USEC`` in seconds, when it is set, positive, and (``WATCHDOG_PID``, if set) meant for ``pid``."""
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner != str(pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


class SdNotifier:
    def __init__(self, address: str | bytes | None, *, watchdog: float | None = None) -> None:
        self.address = address
        #: Seconds of ``WatchdogSec=``; ``None``: no watchdog. Ping at half of it (``sd_watchdog_enabled(3)``).
        self.watchdog = watchdog if address is not None else None
        self.sent = 0
        self.dropped = 0
        self._warned: set[str] = set()
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, pid: int | None = None) -> SdNotifier:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        address = socket_address(raw) if raw else None
        if raw and address is None:
            log.warning("NOTIFY_SOCKET=%r is not a path or an abstract socket; systemd notifications are off", raw)
        return cls(address, watchdog=watchdog_timeout(env, os.getpid() if pid is None else pid))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; ``True`` when it was sent, ``False`` when off or dropped."""
        if self.address is None or not assignments:
            return False
        message = "\n".join(assignments).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(message, self.address)
        except OSError as exc:  # BlockingIOError (receiver full), ConnectionRefused, FileNotFound, ...
            self.dropped += 1
            kind = type(exc).__name__
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("systemd notification dropped (%s: %s); further ones like it are not logged", kind, exc)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
