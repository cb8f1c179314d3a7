"""What the reconcile loop is given: its settings, and the controller session it plans from (``ViewSource``); and
how its parts start their tasks in its nursery (``Spawn``).

Importable from ``provisionerd.execution.loop`` too; they live here so the loop's parts (dispatch, recovery,
reclaims, the outcome log) can use them without importing the loop that composes them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs

from provisionerd.controller.session_settings import LinkState
from provisionerd.controller.view import ControllerView


class ViewSource(Protocol):
    """What the loop needs of the controller session (``ControllerSession`` is one)."""

    view: ControllerView | None
    state: LinkState

    async def changed(self) -> None: ...

    def request_resync(self) -> int:
        """Ask for a resync sent after now; a view with ``sync_seq`` at or above the number returned answers it."""
        ...


class Spawn(Protocol):
    """Start ``fn(*args)`` as a task of the loop's nursery (the loop's parts run their work in it)."""

    def __call__(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...


@attrs.frozen
class LoopSettings:
    replan_interval: float = 10.0
    max_concurrent: int = 32
    reclaim_interval: float = 30.0
    recover_after: float = 30.0
    #: A return that keeps failing (the provider answers ``fail`` for its machines, refuses it, or never finishes) is
    #: retried after ``recover_after`` seconds, then twice as long each time up to ``return_retry_max``; from the
    #: ``return_stuck_after``-th failure in a row on, each failure raises a ``return_stuck`` event.
    return_retry_max: float = 1800.0
    return_stuck_after: int = 3
