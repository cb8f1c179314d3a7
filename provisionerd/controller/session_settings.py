"""What a controller session is given and what it says of itself: its settings, the stream factory it connects
through, the errors a connection attempt may end in, its ``Join.instance``, and its link state.

Plain values, apart from the trio stream type the factory returns; ``provisionerd.controller.session`` runs on them.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable

import attrs
import trio

from provisionerd.config.loader import Backoff, Config
from provisionerd.domain.errors import AuthError, ProtocolError

#: Opens a byte stream to ``host:port`` (TLS done, peer checked). Raises OSError, trio.BrokenResourceError or
#: AuthError when it cannot.
StreamFactory = Callable[[str], Awaitable[trio.abc.Stream]]

CONNECT_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    ProtocolError,
    AuthError,
    trio.TooSlowError,
)


@attrs.frozen
class SessionSettings:
    identity: str
    providers: tuple[str, ...]
    addresses: tuple[str, ...]
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    heartbeat_interval: float = 2.0
    heartbeat_timeout: float = 6.0
    max_redirects: int = 3
    backoff: Backoff = Backoff()
    #: Resync a joined link every this many heartbeat intervals (0: only on join, on want, on a missing snapshot).
    refresh_heartbeats: int = 30
    #: This process start's ``Join.instance``; empty: the session draws one from its RNG (``new_instance``).
    instance: str = ""

    @classmethod
    def from_config(cls, config: Config) -> SessionSettings:
        c = config.controller
        return cls(
            identity=config.identity,
            providers=config.provider_names,
            addresses=c.addresses,
            connect_timeout=c.connect_timeout,
            request_timeout=c.request_timeout,
            heartbeat_interval=c.heartbeat_interval,
            heartbeat_timeout=c.heartbeat_timeout,
            max_redirects=c.max_redirects,
            backoff=c.backoff,
        )


#: The longest ``Join.instance`` the protocol allows (docs/protocol.md §4).
MAX_INSTANCE = 64


def new_instance(rng: random.Random) -> str:
    """A fresh ``Join.instance``: 16 hex characters (64 bits) from ``rng``. Production passes a ``random.Random()``
    seeded from the OS, so two starts never share one; the simulation passes its seeded RNG to repeat a run."""
    return f"{rng.getrandbits(64):016x}"


class LinkState(enum.Enum):
    DOWN = "down"
    CONNECTING = "connecting"
    SYNCING = "syncing"  # joined; resync not folded yet
    UP = "up"
    HALTED = "halted"  # the controller forgot what it acknowledged: not served until an admin accepts the reset
