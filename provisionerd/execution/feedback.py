"""What provider calls meant for the planner, on its way to the reconcile loop: one memory channel of planner
observations (issue 31 item 1: feedback through a channel, never a callback assigned into another object).

The executor sends each observation a call makes the moment it is made (a throttle or a quota pause seen halfway
through a long call acts on the next plan at once), and so does the offer feed for a failed ``getAvailableTemplates``
read (``throttled`` backs the provider off; ``auth_failed``, ``invalid_request``, ``quota_exceeded``: unhealthy).
The reconcile loop is the one reader: it folds each into the planner state and replans. The composition root
(``daemon.builder``) opens the channel and hands each side to its one owner.

Unbounded on purpose: each observation is a few fields, and there are at most a few per provider call in flight;
a sender never waits for the planner. A send after the loop is gone (shutdown) is dropped.
"""

from __future__ import annotations

import math

import attrs
import trio

from provisionerd.planner.state import Observation


@attrs.frozen
class Feedback:
    send: trio.MemorySendChannel[Observation]
    receive: trio.MemoryReceiveChannel[Observation]


def open_feedback() -> Feedback:
    send, receive = trio.open_memory_channel[Observation](math.inf)
    return Feedback(send, receive)


def tell(channel: trio.MemorySendChannel[Observation] | None, obs: Observation) -> None:
    """Send ``obs`` without waiting (nothing when there is no channel, or its reader is gone)."""
    if channel is None:
        return
    try:
        channel.send_nowait(obs)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
