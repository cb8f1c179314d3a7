"""Commits whose outcome is unknown, and the resync that settles them.

A ``FactCommit`` whose link broke before its ``FactAck`` may still be committed: the request was on its way, and a
controller reads what reached it even after the connection is gone. The controller pushes no facts (a daemon learns
of a commit from its ack, of the rest from resyncs), and the heartbeat digest compares only the last log index, which
the daemon's later commits on the new link reach anyway. So such a fact could stay out of the daemon's view for good:
its machine running, in the log, and unknown to the daemon until it restarts (found by the simulation, seed
932997547 of a 10,000-seed campaign from 932987747: an instance fact sent on a link that a 9 s delay broke landed
30 ms after the new link's first resync; the machine ran on past demand).

``CommitDoubt`` is owned by the session and read by each of its links: a commit that ended in ``LinkDown`` marks a
doubt ``grace`` seconds ahead (requests still in flight on the old connection land within it), and a link whose last
resync began before that time resyncs once more when it comes (incrementally: only the facts after its sync point).
"""

from __future__ import annotations

import attrs


@attrs.define
class CommitDoubt:
    #: When a resync settles every commit whose outcome is unknown so far (0: none is).
    at: float = 0.0

    def doubt(self, now: float, grace: float) -> None:
        """A commit ended without its ack at ``now``: a resync at ``now + grace`` or later settles it."""
        self.at = max(self.at, now + grace)

    def due(self, now: float, last_resync_began: float) -> bool:
        """Whether a link whose last resync began at ``last_resync_began`` must resync now for it."""
        return last_resync_began < self.at <= now

    def wake_at(self, last_resync_began: float) -> float:
        """When such a link must wake for it (``inf``: never)."""
        return self.at if self.at > last_resync_began else float("inf")
