"""A ``Pulse``: a count of happenings that others wait on, instead of a callback run inside the one who saw it.

Whoever sees the thing happen calls ``fire()``; each reader keeps the count it has seen and waits for a higher one
(``wait_after(seen)``). Nothing is queued and nothing is lost: a reader that was busy when it fired finds the count
moved on its next look, and many firings while it was busy are one wake-up (level, not edge). The firer runs no code
of its readers, so a reader's failure or slowness is never the firer's.

The session fires ``rejoined`` when a new link's resync is in place (the lease keepers renew at once) and one
``lease_freed`` pulse per provider on the controller's ``LeaseFreed`` push (a waiting keeper asks again at once).
"""

from __future__ import annotations

import trio


class Pulse:
    __slots__ = ("count", "_event")

    def __init__(self) -> None:
        self.count = 0
        self._event = trio.Event()

    def fire(self) -> None:
        self.count += 1
        self._event.set()
        self._event = trio.Event()

    async def wait_after(self, seen: int) -> int:
        """Return the count once it is above ``seen`` (at once if it already is)."""
        while self.count <= seen:
            await self._event.wait()
        return self.count
