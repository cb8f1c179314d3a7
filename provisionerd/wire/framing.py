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
from provisionerd.wire.codec import (
    PREFIX_BYTES,
    FrameHead,
    decode_metered,
    encode,
    framed_reader,
    framed_writer,
    peek,
    peek_prefix,
)
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


#: Above this many bytes, a body is copied out of the receive buffer through a memoryview: one copy. Slicing the
#: bytearray copies it once into a new bytearray and ``bytes`` a second time, and for large bodies the second copy
#: and its allocation cost most (a 1 MiB body: ~750 us against ~18 us on this machine); below, the slice is cheaper
#: than making the view (1.3 KB: 0.16 against 0.29 us).
_VIEW_COPY_FROM = 4096


def _copy(buffer: bytes | bytearray, start: int, end: int) -> bytes:
    """``bytes(buffer[start:end])`` with a single copy (a ``bytes`` slice is one copy already)."""
    if type(buffer) is bytes or end - start < _VIEW_COPY_FROM:
        return bytes(buffer[start:end])
    with memoryview(buffer) as view:  # released before anyone resizes the buffer
        return bytes(view[start:end])


def frame_bytes(body: bytes) -> bytes:
    """``body`` with its length header: what goes on the stream."""
    return HEADER.pack(len(body)) + body


class FramedStream:
    """Frames over ``stream`` (a TCP, TLS or in-memory trio stream).

    Sending is safe from several tasks (they take turns, in FIFO order). Receiving is for one task at a time, like
    the stream underneath. A frame above ``max_frame`` is refused in both directions: received, it raises
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
        # The writers' turn (``send_raw``): True while one of them is in ``send_all``; the others wait in the lot.
        self._sending = False
        self._writers = trio.lowlevel.ParkingLot()
        self._parked = 0  # writers in ``_writers`` or leaving it: a free turn is then one attribute test
        self._writer = framed_writer()  # the native codec's framed encoders, when it is there
        self._reader = framed_reader()  # ``receive`` takes a whole frame in hand in one native call
        self._read_size = min(_READ_CHUNK, HEADER_SIZE + max_frame)  # what ``receive`` asks a chunk of

    # --- sending -----------------------------------------------------------------------------------------------

    def _frame(self, msg: Message, corr: int) -> bytes:
        writer = self._writer
        if writer is not None:
            try:
                return writer[0](msg, corr, self.max_frame)  # header and body written at once
            except writer[2]:
                pass  # what the native writer leaves: ``encode`` and the size check decide
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
        writer = self._writer
        if writer is not None:
            items = items if type(items) is list else list(items)
            try:  # all of them written at once (what each ``_frame`` would give, joined)
                data = writer[1](items, self.max_frame)
            except writer[2]:
                pass  # one the native writer leaves: each is framed (and checked) on its own below
            else:
                if data:
                    await self.send_raw(data)
                return
        frames = [self._frame(msg, corr) for msg, corr in items]
        if frames:
            await self.send_raw(frames[0] if len(frames) == 1 else b"".join(frames))

    async def send_raw(self, data: bytes) -> None:
        """Write already framed bytes (tests use it to send malformed frames)."""
        # One writer in ``send_all`` at a time: a TLS stream raises BusyResourceError on overlap, and a stream that
        # took part of one write could interleave two frames. A flag and a parking lot rather than a trio.Lock: a
        # free turn is one attribute test (the Lock's acquire_nowait + release cost ~1 us, a fifth of what the
        # framing adds to a frame) and no scheduler round (``send_all`` checkpoints anyway). A writer that finishes
        # hands the turn straight to the first one parked (``_sending`` stays True), so newcomers queue behind them.
        # A writer cancelled while parked leaves the lot without the turn (trio removes it); one cancelled or
        # failing inside ``send_all`` passes it on in ``finally``. ``_parked`` (the writers parked, and those leaving
        # the lot until their ``finally`` ran) spares the finishing writer a call of the lot's ``__bool__``; when it
        # counts only leavers, ``unpark`` wakes no one and the turn is free again.
        if self._sending:
            self._parked += 1
            try:
                await self._writers.park()
            finally:
                self._parked -= 1
        else:
            self._sending = True
        try:
            await self.stream.send_all(data)
        finally:
            if not (self._parked and self._writers.unpark()):
                self._sending = False

    # --- receiving ---------------------------------------------------------------------------------------------
    #
    # Each path tests ``len(self._buffer)`` before it awaits ``_fill``: a frame already buffered (the rest of a
    # read-ahead chunk) costs no helper coroutine, and one that is not waits in ``_fill`` right on the stream.

    async def _fill(self, needed: int, length: int = -1) -> bool:
        """Read until the buffer holds ``needed`` bytes. False on an EOF between frames (nothing buffered);
        ``TruncatedFrame`` on an EOF inside a header, or inside a body of ``length`` bytes when one is given."""
        buffer = self._buffer
        while len(buffer) < needed:
            room = HEADER_SIZE + self.max_frame - len(buffer)
            chunk = await self.stream.receive_some(max(needed - len(buffer), min(_READ_CHUNK, room)))
            if not chunk:
                if length >= 0:
                    raise TruncatedFrame(f"stream ended after {len(buffer) - HEADER_SIZE} of {length} body bytes")
                if buffer:
                    raise TruncatedFrame(f"stream ended after {len(buffer)} of {HEADER_SIZE} header bytes")
                return False
            self._charge(len(buffer) + len(chunk))
            buffer += chunk
        return True

    def _length(self) -> int:
        """The buffered header's body length, checked against ``max_frame`` before any body byte is read (the one
        place this is checked: ``FrameTooLarge``)."""
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame:
            raise FrameTooLarge(length, self.max_frame)
        return int(length)

    def _consume(self, n: int) -> None:
        del self._buffer[:n]
        self._charge(len(self._buffer))

    def _take(self, end: int) -> bytes:
        """The buffered body that ends at ``end``, consumed with its header."""
        body = _copy(self._buffer, HEADER_SIZE, end)
        self._consume(end)
        return body

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
        buffer = self._buffer
        if len(buffer) < HEADER_SIZE and not await self._fill(HEADER_SIZE):
            return None
        length = self._length()
        end = HEADER_SIZE + length
        if len(buffer) < end:
            await self._fill(end, length)
        return self._take(end)

    async def _head(self) -> tuple[int, FrameHead, bytes | None] | None:
        """The next frame's body length and head, and its body when the whole of it was needed to settle the head
        (``receive_head``). The frame stays buffered."""
        buffer = self._buffer
        if len(buffer) < HEADER_SIZE and not await self._fill(HEADER_SIZE):
            return None
        length = self._length()
        head = body = None
        if length > PREFIX_BYTES:
            if len(buffer) < HEADER_SIZE + PREFIX_BYTES:
                await self._fill(HEADER_SIZE + PREFIX_BYTES, length)
            head = peek_prefix(_copy(buffer, HEADER_SIZE, HEADER_SIZE + PREFIX_BYTES))
        if head is None:
            end = HEADER_SIZE + length
            if len(buffer) < end:
                await self._fill(end, length)
            body = _copy(buffer, HEADER_SIZE, end)
            head = peek(body)
        limit = bounds.max_body_bytes(head.member, self.max_frame)
        if length > limit:
            raise FrameOverBounds(f"a {head.member} frame of {length} bytes, at most {limit} allowed")
        return length, head, body

    async def receive_head(self) -> FrameHead | None:
        """The next frame's kind and ``corr``, reading as little of it as settles them: its first ``PREFIX_BYTES``
        when it is laid out as writers lay it out (``codec.peek_prefix``), else the whole body. The frame stays
        buffered for ``receive_body``; a caller that refuses it just closes. ``None`` on a clean EOF between frames.
        Raises ``FrameOverBounds`` for a body above its kind's bound (``bounds.max_body_bytes``), before the rest of
        it is read.

        So refusing a 1 MiB frame on its kind costs neither its transfer nor its decoding.
        """
        got = await self._head()
        return None if got is None else got[1]

    async def receive_checked(self, allowed: Collection[type], role: str = "") -> bytes | None:
        """The next frame's body, undecoded, once its kind is in ``allowed``: ``receive(allowed)`` without the
        decoding. ``None`` on a clean EOF between frames.

        Checked in this order, each before any more of the frame is read: its length against ``max_frame``
        (``FrameTooLarge``), its length against its kind's bound (``FrameOverBounds``), its kind against
        ``allowed`` (``OpcodeNotAllowed(role, kind)``); the kind comes from the body's first ``PREFIX_BYTES`` as in
        ``receive_head``. A refused frame stays buffered (the caller drops the peer). The body is copied once.
        """
        got = await self._head()
        if got is None:
            return None
        length, head, body = got
        if head.kind not in allowed:
            raise OpcodeNotAllowed(role, head.member)
        end = HEADER_SIZE + length
        if body is None:
            if len(self._buffer) < end:
                await self._fill(end, length)
            return self._take(end)
        self._consume(end)
        return body

    async def receive(self, allowed: Collection[type] | None = None, role: str = "") -> Envelope | None:
        """The next frame decoded; ``None`` on a clean EOF between frames.

        With ``allowed``, a frame of another kind raises ``OpcodeNotAllowed(role, kind)`` before its body is
        decoded (``receive_checked``). Raises ``FrameTooLarge``, ``TruncatedFrame``, ``BuffersExhausted`` or
        ``DecodeError`` (all ``ProtocolError``: drop the peer), and the stream's own errors
        (``trio.BrokenResourceError``, ``trio.ClosedResourceError``).
        """
        budget, reader = self.budget, self._reader
        if reader is not None and allowed is not None and (budget is None or budget.level >= 0):
            # A whole small frame in hand (the common case): the native codec checks its kind and bound on its
            # head, then decodes it, in one call, with no copy into the buffer when it came in a chunk of its own.
            # Whatever it does not answer, the path below checks and decodes as always, with its typed errors.
            # (``codec.decode_framed_native``, called in place: a function call more costs a frame ~0.3 us.)
            decode_framed, declined = reader
            buffer = self._buffer
            if buffer:
                try:
                    got = decode_framed(buffer, allowed, self.max_frame)
                except declined:
                    got = None
                if got is not None:
                    self._consume(got[2])
            else:
                chunk = await self.stream.receive_some(self._read_size)
                if not chunk:
                    return None  # EOF between frames
                try:
                    got = decode_framed(chunk, allowed, self.max_frame)
                except declined:
                    got = None
                if got is None:
                    self._charge(len(chunk))
                    buffer += chunk
                elif got[2] < len(chunk):
                    rest = chunk[got[2] :]
                    self._charge(len(rest))
                    buffer += rest
            if got is not None:
                if budget is not None:
                    budget.charge(got[1])
                return got[0]
        body = await (self.receive_body() if allowed is None else self.receive_checked(allowed, role))
        if body is None:
            return None
        budget = self.budget
        if budget is not None and budget.level < 0:
            await budget.ready()
        return self._decode_charged(body)

    async def decode(self, body: bytes) -> Envelope:
        """Decode ``body`` (from ``receive_body``) within this connection's decode budget: waits first while the
        budget is in debt, then charges what the decode cost."""
        # A level at or above zero can only grow by the refill ``ready`` would do, and ``charge`` does that same
        # refill first: ``ready`` would return at once and change nothing ``charge`` does not, so skip its call.
        budget = self.budget
        if budget is not None and budget.level < 0:
            await budget.ready()
        return self._decode_charged(body)

    def _decode_charged(self, body: bytes) -> Envelope:
        """Decode ``body`` and charge what it cost to the budget (``decode`` has waited out any debt)."""
        envelope, units = decode_metered(body)
        if self.budget is not None:
            self.budget.charge(units)
        return envelope

    async def aclose(self) -> None:
        await self.stream.aclose()
