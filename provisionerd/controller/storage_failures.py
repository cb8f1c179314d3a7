"""The daemon's record of ``Rejected{storageFailure}``: the controller could not make a write durable (its disk is
full, an I/O error). The session raises ``ControllerStorageFailure`` for each one (the link stays up) and tells this
record (``note``), which logs ``storageFailure`` at WARNING, counts it (``count``: ``storage_failures`` in the
session's status) and emits a ``controller_storage_failure`` event (request, op_id, detail, count) for metrics."""

from __future__ import annotations

import logging

from provisionerd.domain.errors import ControllerRejected, ControllerStorageFailure
from provisionerd.telemetry.events import EventLog
from provisionerd.wire.messages import Message

log = logging.getLogger("provisionerd.controller.session")

#: The controller's detail is its own text: at most this much of it goes into the log and the event.
MAX_DETAIL = 200


class StorageFailures:
    def __init__(self, events: EventLog) -> None:
        self._events = events
        self.count = 0

    def note(self, request: Message, rejection: ControllerRejected) -> None:
        """Record ``rejection`` (the answer to ``request``) if it is a storage failure; any other is not ours."""
        if not isinstance(rejection, ControllerStorageFailure):
            return
        self.count += 1
        kind = type(request).__name__
        op_id = getattr(getattr(request, "fact", None), "op_id", "")
        detail = rejection.detail[:MAX_DETAIL]
        log.warning(
            "controller refused %s%s: storageFailure (%s); nothing was committed, the link is kept (%d so far)",
            kind,
            f" {op_id}" if op_id else "",
            detail,
            self.count,
        )
        self._events.emit("controller_storage_failure", request=kind, op_id=op_id, detail=detail, count=self.count)
