"""What the controller lets in: connection caps, the shared receive-buffer pool, and the refusal record.

**Two budgets per address.** A connection counts as *unauthenticated* from its accept until its TLS handshake
completes with a valid certificate of this cluster; ``max_per_address`` bounds those per IP address. When that
budget is full, a new connection from the address is let in and the *oldest* unauthenticated one from it is closed
(counted as a ``connections_per_address`` refusal): idle sockets, however many, cannot hold an address shut, and a
daemon or agents behind it still get their handshake (issue 33: 197 idle sockets locked an address out for the 10 s
handshake timeout). A connection whose handshake succeeded moves to the address's *authenticated* budget,
``max_authenticated_per_address`` (default: the total cap), which unauthenticated connections never take from.
``max_connections`` bounds both together.

Every refusal goes through ``Gate.refuse``: one log line (reason, peer address, role) and one count per reason and
role, shown in the controller's status under ``refusals``. The reasons:

    connections_total        a new connection while ``max_connections`` are open (closed before TLS)
    connections_per_address  the oldest unauthenticated connection of an address whose budget a new one needed, or
                             an authenticated one over ``max_authenticated_per_address``
    handshake                the TLS handshake failed (no, foreign or expired certificate) or took too long
    no_role                  the certificate carries no role of this cluster
    join_timeout             no complete first frame within the join timeout after the handshake
    not_joined               the first frame is not a Join (refused on its kind, before its body is decoded)
    version_mismatch         the Join speaks another protocol version
    not_allowed              a Join role other than the certificate's, or a frame outside the role's allowlist
                             (refused on its kind, before its body is decoded)
    join_refused             a Join refused on its content (bad identity, instance or provider names)
    token_invalid            a worker Join with a spent, unknown or expired token (or a spent rejoin proof)
    credential_stale         a worker Join with a credential that is not its instance's current one
    credential_revoked       a worker Join of a machine returned or lost (the fact log, or its revoked credential)
    bootstrap_invalid, machine_unknown, machine_joined, address_mismatch, address_bound_off
                             an address-bound worker Join refused (``credentials_address``)
    over_bounds              a frame whose lists exceed the caps of ``provisionerd.wire.bounds``
    buffers_exhausted        a frame would take the bytes buffered by all connections past ``max_buffered_bytes``
    bad_frame                any other framing or decoding error
    storage_failure          a Join whose store rows fail their checksum (``store_rows``): answered, never a bug

A peer that goes away before its Join is answered was not refused: that is logged at INFO and not counted here.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from provisionerd.wire.framing import BufferPool, DecodeBudget

log = logging.getLogger(__name__)


DEFAULT_MAX_CONNECTIONS = 2000
DEFAULT_MAX_PER_ADDRESS = 200
DEFAULT_MAX_BUFFERED_BYTES = 256 << 20


@attrs.frozen
class Limits:
    """The controller's global bounds (``refcontroller serve --max-connections`` etc., docs/protocol.md §2)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_per_address: int = DEFAULT_MAX_PER_ADDRESS
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    #: Connections from one address that completed the TLS handshake with a valid certificate (their own budget).
    max_authenticated_per_address: int = DEFAULT_MAX_CONNECTIONS
    #: Per connection: decoding units (``provisionerd.wire.bounds``) per second, and the burst one frame may use.
    decode_rate: float = 20_000.0
    decode_burst: float = 150_000.0

    def __attrs_post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_per_address",
            "max_buffered_bytes",
            "max_authenticated_per_address",
            "decode_rate",
            "decode_burst",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)!r}")


def peer_address(stream: trio.abc.Stream) -> str:
    """The peer's IP address for a socket (under TLS or not); ``"memory"`` for an in-memory stream."""
    inner: Any = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(inner, trio.SocketStream):
        try:
            return str(inner.socket.getpeername()[0])
        except OSError:
            return "unknown"
    return "memory"


@attrs.define(eq=False)
class Peer:
    """Who is on a connection, as far as known: its address, and its role once its certificate was read."""

    address: str
    role: str = ""


@attrs.define(eq=False)
class Ticket:
    """One admitted connection: its address, the cancel scope that closes it if the gate evicts it, and whether it
    is authenticated yet (``Gate.authenticate``)."""

    address: str
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    authenticated: bool = False
    evicted: bool = False


@attrs.define(eq=False)
class Gate:
    limits: Limits = Limits()
    pool: BufferPool = attrs.field(default=None)
    open_total: int = 0
    peak_total: int = 0  # the most connections open at once since the start
    closed: int = 0  # connections admitted and closed since the start
    open_by_address: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: Per address, its unauthenticated connections, oldest first (the one evicted when the budget is full).
    unauthenticated: dict[str, collections.deque[Ticket]] = attrs.field(factory=dict)
    authenticated_by_address: collections.Counter[str] = attrs.field(factory=collections.Counter)
    refusals: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter)

    def __attrs_post_init__(self) -> None:
        if self.pool is None:
            self.pool = BufferPool(self.limits.max_buffered_bytes)

    def budget(self) -> DecodeBudget:
        return DecodeBudget(self.limits.decode_rate, self.limits.decode_burst)

    @contextmanager
    def admit(self, address: str) -> Iterator[Ticket | None]:
        """Yields the new connection's ticket, or ``None`` when the total cap refuses it. While the block runs the
        connection is counted as open; run it inside ``ticket.scope``: the gate cancels that scope to close the
        connection when a newer unauthenticated one from the same address needs its place (module docstring)."""
        if self.open_total >= self.limits.max_connections:
            self.refuse("connections_total", address, "", f"{self.open_total} connections open")
            yield None
            return
        waiting = self.unauthenticated.setdefault(address, collections.deque())
        if len(waiting) >= self.limits.max_per_address:
            oldest = waiting.popleft()
            oldest.evicted = True
            oldest.scope.cancel()
            self.refuse(
                "connections_per_address",
                address,
                "",
                f"{self.limits.max_per_address} unauthenticated connections open from it: the oldest closed for a"
                " new one",
            )
        ticket = Ticket(address)
        waiting.append(ticket)
        self.open_total += 1
        self.peak_total = max(self.peak_total, self.open_total)
        self.open_by_address[address] += 1
        try:
            yield ticket
        finally:
            self.closed += 1
            self.open_total -= 1
            self.open_by_address[address] -= 1
            if not self.open_by_address[address]:
                del self.open_by_address[address]
            if ticket.authenticated:
                self.authenticated_by_address[address] -= 1
                if not self.authenticated_by_address[address]:
                    del self.authenticated_by_address[address]
            elif not ticket.evicted:
                waiting.remove(ticket)
            if not waiting and self.unauthenticated.get(address) is waiting:
                del self.unauthenticated[address]

    def authenticate(self, ticket: Ticket, role: str) -> bool:
        """The connection completed its TLS handshake with a valid certificate of ``role``: it leaves the address's
        unauthenticated budget for the authenticated one. ``False`` (refused, counted) when that one is full."""
        if ticket.authenticated or ticket.evicted:
            return not ticket.evicted
        address = ticket.address
        if self.authenticated_by_address[address] >= self.limits.max_authenticated_per_address:
            self.refuse(
                "connections_per_address", address, role, f"{self.authenticated_by_address[address]} authenticated open"
            )
            return False
        self.unauthenticated[address].remove(ticket)
        ticket.authenticated = True
        self.authenticated_by_address[address] += 1
        return True

    def refuse(self, reason: str, address: str, role: str, detail: str) -> None:
        """Log and count one refusal. ``detail`` is for humans and never holds a token or a credential."""
        self.refusals[(reason, role or "-")] += 1
        log.warning("refused reason=%s peer=%s role=%s: %s", reason, address, role or "-", detail[:300])

    def status(self) -> dict[str, Any]:
        by_reason: dict[str, dict[str, int]] = {}
        for (reason, role), n in sorted(self.refusals.items()):
            by_reason.setdefault(reason, {})[role] = n
        return {
            "connections": self.open_total,
            "peak_connections": self.peak_total,
            "addresses": len(self.open_by_address),
            "authenticated": sum(self.authenticated_by_address.values()),
            "buffered_bytes": self.pool.in_use,
            "refusals": by_reason,
            "limits": attrs.asdict(self.limits),
        }


def _libc_malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another libc, another system)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


#: Connections closed since the last full collection that make a burst worth one (a flood, not everyday churn).
BURST_CLOSES = 64


async def return_memory(gate: Gate, interval: float = 2.0, burst: int = BURST_CLOSES) -> None:
    """Hand the memory closed connections held back to the system: every ``interval`` seconds in which connections
    closed, and once more when they stop closing.

    Python frees a closed connection's buffers and TLS state, but glibc keeps the freed heap pages (and raises its
    mmap threshold after the first large frees, so later buffers land on the heap too): without trimming, RSS after
    a flood stays near its peak. ``malloc_trim(0)`` releases every free page; it costs about a millisecond.

    Not everything a connection held is freed when it closes: its task's exceptions and tracebacks form reference
    cycles with the TLS object and its buffers, and those connections lived long enough (a handshake or join
    timeout) for the cycles to reach the oldest generation, which CPython collects rarely. So once the closing has
    stopped (one quiet interval) after a burst of at least ``burst`` closes, one full collection runs before the
    trim (tens of milliseconds after a flood of 1600 connections; everyday churn never triggers it). Measured with
    ``bench/flood.py`` (issue 33), RSS 60 s after three floods against the idle controller's: 3.8 times before
    this, 1.3-1.4 times with it on pymalloc, 1.07 times on glibc's malloc (``refcontroller.allocator``).
    """
    trim = _libc_malloc_trim()
    try:  # M_MMAP_THRESHOLD (-3) fixed at 128 KiB: a frame buffer is its own mapping, unmapped when freed
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
    except (OSError, AttributeError):
        pass
    seen = collected = gate.closed
    settle = False
    while True:
        await trio.sleep(interval)
        if gate.closed != seen:  # still closing: trim what is free now, and look again after a quiet interval
            seen, settle = gate.closed, True
        elif settle:
            settle = False
            if gate.closed - collected >= burst:
                collected = gate.closed
                gc.collect()
        else:
            continue
        if trim is not None:
            trim(0)
