"""Bulk sends that leave a link's replies prompt: wait for the socket to drain before the next resync page.

A resync page and a heartbeat ack share one TCP stream, so the ack waits behind every page byte written before
it. The kernel takes a page as soon as its send buffer has room, and Linux grows that buffer to megabytes: a
controller that writes pages as fast as it makes them puts seconds of the peer's decoding ahead of its next ack
(a live_100k resync: heartbeat round trips of 110-400 ms). So before each page the session waits until the bytes
the socket has not sent yet (``SIOCOUTQNSD``) are at most ``LOW_WATER``: the peer then has at most its own
receive window and one page ahead of any reply, and the pages still overlap the peer's decoding (the next one is
made while it reads this one). The wait polls the socket (``POLL`` apart); it does not wait for writability,
which would conflict with a reply's own send on the same socket (trio allows one waiter per socket and
direction).

Where the count cannot be read (another OS, an in-memory stream, a closed socket) the pages go at once, as before.
"""

from __future__ import annotations

import fcntl
import struct
import sys

import trio

#: Unsent bytes in the socket below which the next bulk frame is written (a page is ~64-128 KB).
LOW_WATER = 16 * 1024
#: How often a backed-up socket is looked at again.
POLL = 0.001
#: ``ioctl`` request for a TCP socket's bytes not yet sent (``linux/sockios.h``); Linux only.
SIOCOUTQNSD = 0x894B


def unsent_bytes(stream: trio.abc.Stream) -> int | None:
    """Bytes written to ``stream``'s TCP socket that it has not sent yet, or ``None`` when that cannot be read."""
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if not isinstance(inner, trio.SocketStream) or not sys.platform.startswith("linux"):
        return None
    try:
        fd = inner.socket.fileno()
        if fd < 0:
            return None
        (count,) = struct.unpack("i", fcntl.ioctl(fd, SIOCOUTQNSD, b"\0\0\0\0"))
    except OSError:
        return None
    return int(count)


async def until_drained(stream: trio.abc.Stream, low_water: int = LOW_WATER, poll: float = POLL) -> None:
    """Return once ``stream``'s socket holds at most ``low_water`` unsent bytes (at once when it cannot say).

    Always a checkpoint. The caller bounds the wait (the session's send timeout)."""
    await trio.lowlevel.checkpoint()
    # Polled, not an Event: the kernel tells of a drained socket only through writability (see the docstring).
    while (unsent := unsent_bytes(stream)) is not None and unsent > low_water:  # noqa: ASYNC110
        await trio.sleep(poll)
