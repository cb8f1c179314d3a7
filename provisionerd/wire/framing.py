"""Length-prefixed frames over any trio ``Stream``: 8-byte little-endian unsigned body length, then the body.

``FramedStream`` is the only thing in the daemon and the reference controller that touches a connection's bytes.
Memory is bounded by one frame: the length is checked against ``max_frame`` before a single body byte is read, and
the receive buffer never holds more than a header plus ``max_frame`` bytes. A server bounds more than that:

- a ``BufferPool`` shared by all its connections caps the bytes they buffer together beyond a small allowance
  each (``POOL_FREE_BYTES``; a connection that would take the pool past its cap is dropped with
  ``BuffersExhausted``), and gets every byte back when a connection ends;
- ``receive(allowed=...)`` reads the frame's kind first (``codec.peek``) and refuses a kind outside ``allowed``
  with ``OpcodeNotAllowed`` before the body is decoded;
- a ``DecodeBudget`` per connection (a token bucket of the codec's units on trio's clock) makes a peer that keeps
  sending expensive frames wait for its next decode, so it cannot take the event loop from the others.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable

import attrs
import trio

from provisionerd.domain.errors import (
    BuffersExhausted,
    FrameOverBounds,
    FrameTooLarge,
    OpcodeNotAllowed,
    TruncatedFrame,
)
from provisionerd.wire import bounds
from provisionerd.wire.codec import PREFIX_BYTES, FrameHead, decode_metered, encode, peek, peek_prefix
from provisionerd.wire.messages import Envelope, Message

HEADER = struct.Struct("<Q")
HEADER_SIZE = HEADER.size  # 8
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB
#: How much to ask the transport for at once when more than the current frame's remainder may be waiting. Reading
#: ahead cuts syscalls for bursts of small frames; it never takes the buffer past one header + max_frame.
_READ_CHUNK = 64 * 1024


@attrs.define(eq=False)
class BufferPool:
    """Bytes buffered by all the connections of one server, at most ``limit``. ``in_use`` is what they hold now."""

    limit: int
    in_use: int = 0
    refused: int = 0

    def take(self, n: int) -> None:
        """Account ``n`` more buffered bytes, or raise ``BuffersExhausted`` (and account nothing)."""
        if self.in_use + n > self.limit:
            self.refused += 1
            raise BuffersExhausted(f"{self.in_use} of {self.limit} buffered bytes in use, {n} more refused")
        self.in_use += n

    def give_back(self, n: int) -> None:
        self.in_use -= n


@attrs.define(eq=False)
class DecodeBudget:
    """A token bucket of decoding units (``codec.decode_metered``) for one connection, on trio's clock.

    It holds at most ``burst`` units and refills at ``rate`` per second. A decode may overdraw it (its cost is
    known once it is done; ``bounds.py`` caps one frame's); the next decode then waits until the level is back
    at zero, so a peer gets at most ``rate`` units per second over time, whatever it sends.
    """

    rate: float
    burst: float
    level: float = attrs.field(init=False)
    stamp: float | None = attrs.field(init=False, default=None)
    waited: float = attrs.field(init=False, default=0.0)  # seconds this connection was held back

    def __attrs_post_init__(self) -> None:
        if not (self.rate > 0 and self.burst > 0):
            raise ValueError(f"rate and burst must be positive, not {self.rate!r}, {self.burst!r}")
        self.level = self.burst

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    async def ready(self) -> None:
        """Return once the bucket is not in debt."""
        self._refill(trio.current_time())
        if self.level < 0:
            delay = -self.level / self.rate
            self.waited += delay
            await trio.sleep(delay)
            self._refill(trio.current_time())

    def charge(self, units: int) -> None:
        self._refill(trio.current_time())
        self.level -= units


#: Bytes each connection may buffer without drawing on its server's ``BufferPool`` (times the connection cap,
#: this is part of the memory bound).
POOL_FREE_BYTES = 64 * 1024


def frame_bytes(body: bytes) -> bytes:
    """``body`` with its length header: what goes on the stream."""
    return HEADER.pack(len(body)) + body


class FramedStream:
    """Frames over ``stream`` (a TCP, TLS or in-memory trio stream).

    Sending is safe from several tasks (a lock serializes writers). Receiving is for one task at a time, like the
    stream underneath. A frame above ``max_frame`` is refused in both directions: received, it raises
    ``FrameTooLarge`` before its body is read; sent, it raises ``FrameTooLarge`` and nothing is written.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        max_frame: int = DEFAULT_MAX_FRAME,
        *,
        pool: BufferPool | None = None,
        budget: DecodeBudget | None = None,
    ) -> None:
        if max_frame < 8:
            raise ValueError(f"max_frame must be at least 8 bytes, not {max_frame!r}")
        self.stream = stream
        self.max_frame = max_frame
        self.pool = pool
        self._charged = 0  # what this connection holds of the pool
        self.budget = budget
        self._buffer = bytearray()
        self._send_lock = trio.Lock()

    # --- sending -----------------------------------------------------------------------------------------------

    def _frame(self, msg: Message, corr: int) -> bytes:
        body = encode(msg, corr)
        if len(body) > self.max_frame:
            raise FrameTooLarge(len(body), self.max_frame)
        return frame_bytes(body)

    async def send(self, msg: Message, corr: int = 0) -> None:
        """Encode and send one frame. Raises ``FrameTooLarge`` (nothing sent) or the stream's errors."""
        await self.send_raw(self._frame(msg, corr))

    async def send_many(self, items: Iterable[tuple[Message, int]]) -> None:
        """Send ``(msg, corr)`` pairs as one write (one TLS record run, one syscall), in order.

        Every frame is encoded and size-checked first, so either all of them are handed to the stream or none.
        """
        data = b"".join(self._frame(msg, corr) for msg, corr in items)
        if data:
            await self.send_raw(data)

    async def send_raw(self, data: bytes) -> None:
        """Write already framed bytes (tests use it to send malformed frames)."""
        # trio.Lock's ``acquire`` yields to the scheduler even when the lock is free (a full round of the run
        # queue per frame, ~10-25 us at 1 KB frames: bench/wire.py); ``send_all`` checkpoints anyway, so an
        # uncontended writer takes the lock at once and only a second writer waits its turn.
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            await self.stream.send_all(data)
        finally:
            self._send_lock.release()

    # --- receiving ---------------------------------------------------------------------------------------------

    async def _fill(self, needed: int) -> bool:
        """Read until the buffer holds ``needed`` bytes. False on EOF first (the buffer keeps what came)."""
        while len(self._buffer) < needed:
            room = HEADER_SIZE + self.max_frame - len(self._buffer)
            chunk = await self.stream.receive_some(max(needed - len(self._buffer), min(_READ_CHUNK, room)))
            if not chunk:
                return False
            self._charge(len(self._buffer) + len(chunk))
            self._buffer += chunk
        return True

    def _consume(self, n: int) -> None:
        del self._buffer[:n]
        self._charge(len(self._buffer))

    def _charge(self, buffered: int) -> None:
        """Hold of the pool what ``buffered`` bytes take beyond the first ``POOL_FREE_BYTES``: a connection always
        has room for a small frame (a Join, a heartbeat), so big half-sent frames of others cannot lock it out."""
        if self.pool is None:
            return
        want = max(0, buffered - POOL_FREE_BYTES)
        if want > self._charged:
            self.pool.take(want - self._charged)
        elif want < self._charged:
            self.pool.give_back(self._charged - want)
        self._charged = want

    def release(self) -> None:
        """Drop whatever is buffered and give it back to the pool (the server calls it when a connection ends)."""
        self._consume(len(self._buffer))

    async def receive_body(self) -> bytes | None:
        """The next frame's body undecoded; ``None`` on a clean EOF between frames.

        Raises:
            FrameTooLarge: the header announces more than ``max_frame`` (no body byte is read).
            TruncatedFrame: the stream ended inside a header or a body.
        """
        length = await self._body_length()
        if length is None:
            return None
        if not await self._fill(HEADER_SIZE + length):
            got = len(self._buffer) - HEADER_SIZE
            raise TruncatedFrame(f"stream ended after {got} of {length} body bytes")
        body = bytes(self._buffer[HEADER_SIZE : HEADER_SIZE + length])
        self._consume(HEADER_SIZE + length)
        return body

    async def _body_length(self) -> int | None:
        """The next frame's body length from its header (``None``: a clean EOF between frames), checked against
        ``max_frame`` before any body byte is read (``FrameTooLarge``; ``TruncatedFrame`` inside a header)."""
        if not await self._fill(HEADER_SIZE):
            if self._buffer:
                raise TruncatedFrame(f"stream ended after {len(self._buffer)} of {HEADER_SIZE} header bytes")
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame:
            raise FrameTooLarge(length, self.max_frame)
        return int(length)

    async def receive_head(self) -> FrameHead | None:
        """The next frame's kind and ``corr``, reading as little of it as settles them: its first ``PREFIX_BYTES``
        when it is laid out as writers lay it out (``codec.peek_prefix``), else the whole body. The frame stays
        buffered for ``receive_body``; a caller that refuses it just closes. ``None`` on a clean EOF between frames.

        So refusing a 1 MiB frame on its kind costs neither its transfer nor its decoding.
        """
        length = await self._body_length()
        if length is None:
            return None
        for size in (min(length, PREFIX_BYTES), length):
            if not await self._fill(HEADER_SIZE + size):
                raise TruncatedFrame(f"stream ended after {len(self._buffer) - HEADER_SIZE} of {length} body bytes")
            part = bytes(self._buffer[HEADER_SIZE : HEADER_SIZE + size])
            head = peek_prefix(part) if size < length else peek(part)
            if head is not None:
                limit = bounds.max_body_bytes(head.member, self.max_frame)
                if length > limit:
                    raise FrameOverBounds(f"a {head.member} frame of {length} bytes, at most {limit} allowed")
                return head
        raise AssertionError("unreachable: peek of the whole body answers or raises")

    async def receive(self, allowed: Collection[type] | None = None, role: str = "") -> Envelope | None:
        """The next frame decoded; ``None`` on a clean EOF between frames.

        With ``allowed``, a frame of another kind raises ``OpcodeNotAllowed(role, kind)`` before its body is
        decoded. Raises ``FrameTooLarge``, ``TruncatedFrame``, ``BuffersExhausted`` or ``DecodeError`` (all
        ``ProtocolError``: drop the peer), and the stream's own errors (``trio.BrokenResourceError``,
        ``trio.ClosedResourceError``).
        """
        if allowed is not None:
            head = await self.receive_head()
            if head is None:
                return None
            if head.kind not in allowed:
                raise OpcodeNotAllowed(role, head.member)
        body = await self.receive_body()
        return None if body is None else await self.decode(body)

    async def decode(self, body: bytes) -> Envelope:
        """Decode ``body`` (from ``receive_body``) within this connection's decode budget: waits first while the
        budget is in debt, then charges what the decode cost."""
        if self.budget is None:
            return decode_metered(body)[0]
        await self.budget.ready()
        envelope, units = decode_metered(body)
        self.budget.charge(units)
        return envelope

    async def aclose(self) -> None:
        await self.stream.aclose()
