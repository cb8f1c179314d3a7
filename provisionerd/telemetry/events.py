"""The JSON-lines events stream (for machines) next to the human log (for people).

``EventLog.emit("lease_lost", provider="sim", epoch=Epoch(3, 1), reason="...")`` writes one JSON object per line
with ``ts`` (wall clock, epoch seconds), ``mono`` (trio's clock when inside ``trio.run``) and ``event``, logs the
same for humans as ``event key=value...`` (``telemetry.logfmt``, no Python reprs) at the kind's level
(``telemetry.severity``: faults at WARNING or ERROR, the routine of an idle fleet at DEBUG), and keeps the most
recent events in memory for ``provisionerd status`` and tests. Each record is also counted, in the same call, by the
log's own ``counters`` (``telemetry.metrics.EventCounters``, which the daemon's registry exports): nothing is
handed a callback, and no record is dropped on the way to a counter.

Every record names the process that wrote it: ``"process": {"pid": ..., "instance": ...}`` (``ProcessInstance``),
so two daemons appending to one events file (two starts of one config, say) stay apart. ``instance`` is random per
process start (16 hex characters); ``DaemonCore`` sets it to its ``Join.instance``, the name the controller knows
the process (lease holder) by.

The kinds the daemon emits, each with its level, are the table in ``telemetry.severity``.
Callers must never pass secrets (credentials, join tokens) as fields.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from provisionerd.telemetry.files import open_private
from provisionerd.telemetry.logfmt import fields_text
from provisionerd.telemetry.logging_setup import event_extra, json_default
from provisionerd.telemetry.metrics import EventCounters
from provisionerd.telemetry.severity import level_of

log = logging.getLogger("provisionerd.events")


def _json_default(value: Any) -> Any:
    return json_default(value, other=repr)  # the one conversion, with repr for values it does not know


def _mono() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # not inside trio.run (a sync caller or a test)
        return None


@attrs.frozen
class ProcessInstance:
    """Which process start wrote an event: its pid and a random name of the start (never reused)."""

    pid: int
    instance: str

    @classmethod
    def current(cls, instance: str = "") -> ProcessInstance:
        return cls(os.getpid(), instance or secrets.token_hex(8))

    def as_field(self) -> dict[str, Any]:
        return {"pid": self.pid, "instance": self.instance}


class EventLog:
    """Append-only events: an optional JSON-lines file, the ``logging`` module, and a bounded in-memory tail.

    Writes are small appends to a local file, done synchronously so an event is on disk (flushed) before the
    decision it records has consequences; ``emit`` never raises on a full disk, it logs the failure once.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        keep: int = 1000,
        process: ProcessInstance | None = None,
        counters: EventCounters | None = None,
    ) -> None:
        #: Named in every record (``"process"``); replace it with ``attrs.evolve`` to name the start otherwise.
        self.process = process if process is not None else ProcessInstance.current()
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        #: The Prometheus counters every record feeds (``DaemonMetrics`` registers them).
        self.counters = counters if counters is not None else EventCounters()
        self._path = path
        self._file: TextIO | None = None
        self._write_failed = False
        if path is not None:
            # 0600 in a 0700 directory whatever the umask (telemetry.files); never through a planted symlink.
            self._file = os.fdopen(open_private(path), "a", encoding="utf-8")

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {
            "ts": round(time.time(), 6),
            "mono": _mono(),
            "event": event,
            "process": self.process.as_field(),
            **fields,
        }
        self.recent.append(record)
        line = json.dumps(record, default=_json_default, sort_keys=False)
        level = level_of(event)
        if log.isEnabledFor(level):
            text = fields_text(fields)
            log.log(
                level, "%s %s" if text else "%s", event, *((text,) if text else ()), extra=event_extra(event, fields)
            )
        if self._file is not None:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError as exc:
                if not self._write_failed:
                    log.error("cannot write events log %s: %s", self._path, exc)
                    self._write_failed = True
        self.counters.add(record)
        return record

    def of_kind(self, *events: str) -> Iterator[dict[str, Any]]:
        return (record for record in self.recent if record["event"] in events)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
