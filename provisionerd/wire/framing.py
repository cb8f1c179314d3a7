"""Length-prefixed frames over any trio ``Stream``: 8-byte little-endian unsigned body length, then the body.

``FramedStream`` is the only thing in the daemon and the reference controller that touches a connection's bytes.
Memory is bounded by one frame: the length is checked against ``max_frame`` before a single body byte is read, and
the receive buffer never holds more than a header plus ``max_frame`` bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import trio

from provisionerd.domain.errors import FrameTooLarge, TruncatedFrame
from provisionerd.wire.codec import decode, encode
from provisionerd.wire.messages import Envelope, Message

HEADER = struct.Struct("<Q")
HEADER_SIZE = HEADER.size  # 8
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB
#: How much to ask the transport for at once when more than the current frame's remainder may be waiting. Reading
#: ahead cuts syscalls for bursts of small frames; it never takes the buffer past one header + max_frame.
_READ_CHUNK = 64 * 1024


def frame_bytes(body: bytes) -> bytes:
    """``body`` with its length header: what goes on the stream."""
    return HEADER.pack(len(body)) + body


class FramedStream:
    """Frames over ``stream`` (a TCP, TLS or in-memory trio stream).

    Sending is safe from several tasks (a lock serializes writers). Receiving is for one task at a time, like the
    stream underneath. A frame above ``max_frame`` is refused in both directions: received, it raises
    ``FrameTooLarge`` before its body is read; sent, it raises ``FrameTooLarge`` and nothing is written.
    """

    def __init__(self, stream: trio.abc.Stream, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 8:
            raise ValueError(f"max_frame must be at least 8 bytes, not {max_frame!r}")
        self.stream = stream
        self.max_frame = max_frame
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
        async with self._send_lock:
            await self.stream.send_all(data)

    # --- receiving ---------------------------------------------------------------------------------------------

    async def _fill(self, needed: int) -> bool:
        """Read until the buffer holds ``needed`` bytes. False on EOF first (the buffer keeps what came)."""
        while len(self._buffer) < needed:
            room = HEADER_SIZE + self.max_frame - len(self._buffer)
            chunk = await self.stream.receive_some(max(needed - len(self._buffer), min(_READ_CHUNK, room)))
            if not chunk:
                return False
            self._buffer += chunk
        return True

    async def receive_body(self) -> bytes | None:
        """The next frame's body undecoded; ``None`` on a clean EOF between frames.

        Raises:
            FrameTooLarge: the header announces more than ``max_frame`` (no body byte is read).
            TruncatedFrame: the stream ended inside a header or a body.
        """
        if not await self._fill(HEADER_SIZE):
            if self._buffer:
                raise TruncatedFrame(f"stream ended after {len(self._buffer)} of {HEADER_SIZE} header bytes")
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame:
            raise FrameTooLarge(length, self.max_frame)
        if not await self._fill(HEADER_SIZE + length):
            got = len(self._buffer) - HEADER_SIZE
            raise TruncatedFrame(f"stream ended after {got} of {length} body bytes")
        body = bytes(self._buffer[HEADER_SIZE : HEADER_SIZE + length])
        del self._buffer[: HEADER_SIZE + length]
        return body

    async def receive(self) -> Envelope | None:
        """The next frame decoded; ``None`` on a clean EOF between frames.

        Raises ``FrameTooLarge``, ``TruncatedFrame`` or ``DecodeError`` (all ``ProtocolError``: drop the peer), and
        the stream's own errors (``trio.BrokenResourceError``, ``trio.ClosedResourceError``).
        """
        body = await self.receive_body()
        return None if body is None else decode(body)

    async def aclose(self) -> None:
        await self.stream.aclose()
