"""In-memory connections between simulated daemons and the controller's replicas, with seeded network faults.

Each connection is a pair of ``SimStream`` ends over two one-way pipes. A pipe carries whole ``send_all`` writes
(``FramedStream`` writes whole frames, so a write is one or more complete frames) and delivers each one after a
latency, never reordering (a write is never delivered before an earlier one). What a pipe does with a write depends
on the *direction state* of the daemon's slot at the time of the write:

``ok``     delivered after the slot's latency (plus the direction's extra ``delay``)
``drop``   thrown away, end of stream included (a black hole: the peer notices only through its timeouts)
``stall``  held back and delivered, in order, when the direction heals (a late reply, a late lease grant)

and, controller to daemon only, ``drop_pushes`` throws away the frames with ``corr == 0`` (demand pages, host
states) and delivers the rest. The faults belong to the daemon's *slot* (``"a"``, ``"b"``), not to one connection,
so a reconnect made during a partition is cut too: ``connect`` fails (after a seeded wait) while either direction
is not ``ok``.

Everything runs on trio's clock and draws its randomness from the ``random.Random`` given to ``SimNet``.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable

import attrs
import trio

from provisionerd.wire.codec import decode
from provisionerd.wire.framing import HEADER, HEADER_SIZE

_EOF = b""

OK, DROP, STALL = "ok", "drop", "stall"
UP, DOWN = "c2s", "s2c"  # daemon -> controller, controller -> daemon


@attrs.define
class Direction:
    mode: str = OK
    delay: float = 0.0  # extra seconds on top of the slot's latency
    drop_pushes: bool = False  # controller -> daemon only


@attrs.define
class SlotNet:
    """The network seen by one daemon slot: base latency and the state of both directions."""

    latency: float
    up: Direction = attrs.field(factory=Direction)
    down: Direction = attrs.field(factory=Direction)

    def direction(self, which: str) -> Direction:
        return self.up if which == UP else self.down


class _Pipe:
    """One direction of one connection: ``(due, bytes)`` items; ``b""`` is the end of stream."""

    def __init__(self, net: SimNet, slot: str, which: str) -> None:
        self.net = net
        self.slot = slot
        self.which = which
        self.items: collections.deque[tuple[float, bytes]] = collections.deque()
        self.held: list[bytes] = []
        self.last_due = 0.0
        self.reader_closed = False
        self.writer_closed = False
        self.changed = trio.Event()
        self.stats = net.stats

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def put(self, data: bytes) -> None:
        state = self.net.slots[self.slot]
        direction = state.direction(self.which)
        if direction.mode == DROP:
            self.stats["dropped_writes"] += 1
            return
        if direction.mode == STALL:
            self.held.append(data)
            return
        if data and direction.drop_pushes and self.which == DOWN:
            data = _without_pushes(data)
            if not data:
                self.stats["dropped_push_writes"] += 1
                return
        self._deliver(data, state.latency + direction.delay)

    def _deliver(self, data: bytes, delay: float) -> None:
        jitter = self.net.rng.random() * delay * 0.2 if delay else 0.0
        due = max(trio.current_time() + delay + jitter, self.last_due)
        self.last_due = due
        self.items.append((due, data))
        self._wake()

    def heal(self) -> None:
        """The direction is ``ok`` again: what was held back goes out now, in order."""
        held, self.held = self.held, []
        state = self.net.slots[self.slot]
        for data in held:
            self._deliver(data, state.latency + state.direction(self.which).delay)


def _without_pushes(data: bytes) -> bytes:
    """The frames of ``data`` whose ``corr`` is not 0 (``data`` holds whole frames: FramedStream writes them)."""
    kept = []
    view = memoryview(data)
    offset = 0
    while offset + HEADER_SIZE <= len(view):
        (length,) = HEADER.unpack_from(view, offset)
        end = offset + HEADER_SIZE + length
        frame = bytes(view[offset:end])
        try:
            push = decode(frame[HEADER_SIZE:]).corr == 0
        except Exception:  # not ours to judge: deliver it and let the receiver fail on it
            push = False
        if not push:
            kept.append(frame)
        offset = end
    return b"".join(kept)


class SimStream(trio.abc.Stream):
    """One end of a simulated connection (``send`` is its outgoing pipe, ``recv`` its incoming one)."""

    def __init__(self, send: _Pipe, recv: _Pipe) -> None:
        self._send = send
        self._recv = recv
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self._send.reader_closed:
            raise trio.BrokenResourceError("the peer closed the connection")
        if data:
            self._send.put(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        pipe = self._recv
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this end is closed")
            if pipe.items:
                due, data = pipe.items[0]
                now = trio.current_time()
                if due <= now:
                    if data == _EOF:
                        return b""
                    if max_bytes is not None and len(data) > max_bytes:
                        pipe.items[0] = (due, data[max_bytes:])
                        return data[:max_bytes]
                    pipe.items.popleft()
                    return data
                with trio.move_on_at(due):
                    await pipe.changed.wait()
            else:
                await pipe.changed.wait()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._recv.reader_closed = True
            self._recv._wake()
            if not self._send.writer_closed:
                self._send.writer_closed = True
                self._send.put(_EOF)
        await trio.lowlevel.checkpoint()


class SimNet:
    """Daemon slots connecting to replica addresses ``ctl0:7400``...; the server side is handed to ``serve``."""

    def __init__(
        self,
        rng: random.Random,
        addresses: tuple[str, ...],
        serve: Callable[[trio.abc.Stream, int], None],
    ) -> None:
        self.rng = rng
        self.addresses = addresses
        self._serve = serve
        self.slots: dict[str, SlotNet] = {}
        self.pipes: list[_Pipe] = []
        self.stats: collections.Counter[str] = collections.Counter()

    def add_slot(self, slot: str) -> SlotNet:
        # Most slots get no latency at all (a frame is readable in the same scheduler pass, which keeps runs
        # cheap); the others a few milliseconds, which reorders what reaches the controller from different slots.
        latency = 0.0 if self.rng.random() < 0.7 else 0.0005 + self.rng.random() * 0.01
        state = self.slots[slot] = SlotNet(latency=latency)
        return state

    def connector(self, slot: str) -> Callable[[str], object]:
        """The ``StreamFactory`` a daemon in ``slot`` uses."""

        async def connect(address: str) -> trio.abc.Stream:
            return await self.connect(slot, address)

        return connect

    async def connect(self, slot: str, address: str) -> trio.abc.Stream:
        state = self.slots[slot]
        self.stats["connects"] += 1
        if address not in self.addresses or state.up.mode != OK or state.down.mode != OK:
            # A SYN into a partition (or an unknown host): the connect fails after a while.
            await trio.sleep(0.05 + self.rng.random() * 1.5)
            self.stats["connects_failed"] += 1
            raise OSError(f"cannot reach {address}")
        await trio.sleep(state.latency * 3)  # the handshake's round trips
        self.pipes = [p for p in self.pipes if not (p.reader_closed and p.writer_closed)]
        up, down = _Pipe(self, slot, UP), _Pipe(self, slot, DOWN)
        self.pipes += [up, down]
        self._serve(SimStream(send=down, recv=up), self.addresses.index(address))
        return SimStream(send=up, recv=down)

    def set_direction(self, slot: str, which: str, mode: str, delay: float = 0.0, drop_pushes: bool = False) -> None:
        """Change one direction of ``slot``; going back to ``ok`` releases what a stall held."""
        direction = self.slots[slot].direction(which)
        direction.mode, direction.delay, direction.drop_pushes = mode, delay, drop_pushes
        if mode == OK:
            for pipe in self.pipes:
                if pipe.slot == slot and pipe.which == which and pipe.held:
                    pipe.heal()
