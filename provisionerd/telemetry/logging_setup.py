"""The human log's setup: ``text`` (the default) or ``json`` (one object per line), both through one redactor.

``configure_logging("info", "json", redact=...)`` installs one stderr handler on the root logger (replacing one it
installed before, leaving any other handler alone). A JSON line holds ``ts`` (UTC, ISO 8601 with microseconds),
``level``, ``logger``, ``message`` and, for a record of the events stream (``telemetry.events``), ``event`` and the
event's fields at the top level (a field named like one of those keys gets a trailing ``_``); an exception adds
``exc``; a line that stands for held-back copies (``collapse``) adds ``repeated``; ``static`` fields (the agent's
``pid``) are added to every line.

Redaction is the same for both formats: the callable ``redact`` (the provider runtime's ``Redactor`` over every
configured credential value, built by the caller, which is above this layer) is applied to the whole formatted
line, so a secret in a message, a field or a traceback never reaches stderr in either format. Secrets are also
kept out of log calls by construction (invariant 8); this is the net under that.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, TextIO

import attrs

from provisionerd.domain.model import Epoch
from provisionerd.telemetry.log_collapse import Collapser, collapse_key

if TYPE_CHECKING:  # the config loader (and its jsonschema) is not imported by every process that logs: agents do not
    from provisionerd.config.loader import ProviderConfig

LOG_FORMATS = ("text", "json")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Keys every JSON line has; an event field of the same name is written as ``<name>_``.
RESERVED = frozenset({"ts", "level", "logger", "message", "event", "exc", "repeated"})

#: The ``LogRecord`` attributes the events stream sets (``EventLog.emit`` passes ``extra=event_extra(...)``).
EVENT_ATTR = "provisionerd_event"
FIELDS_ATTR = "provisionerd_fields"

Redact = Callable[[str], str]


def event_extra(event: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The ``extra`` of an event's log record: the JSON format writes the event and its fields as keys."""
    return {EVENT_ATTR: event, FIELDS_ATTR: fields}


def json_default(value: Any, *, other: Callable[[Any], str] = str) -> Any:
    """Values ``json`` cannot write, for the JSON log and the events stream alike: an ``Epoch`` and a ``Path`` as
    their text, attrs values as objects, sets and tuples as lists, anything else through ``other`` (``str`` here;
    the events stream passes ``repr``)."""
    if isinstance(value, (Epoch, PurePath)):
        return str(value)
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return other(value)


def _unchanged(text: str) -> str:
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (``json.dumps`` escapes every newline inside values)."""

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, EVENT_ATTR, None)
        if isinstance(event, str):
            out["event"] = event
            fields = getattr(record, FIELDS_ATTR, None)
            if isinstance(fields, Mapping):
                for key, value in fields.items():
                    out[f"{key}_" if key in RESERVED else str(key)] = value
        repeated = getattr(record, "repeated", None)
        if isinstance(repeated, int):
            out["repeated"] = repeated
        for key, value in self.static.items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=json_default, ensure_ascii=False)


class RedactingFormatter(logging.Formatter):
    """Formats with ``inner``, then redacts the whole line. ``redact`` may be replaced (a reload's new secrets)."""

    def __init__(self, inner: logging.Formatter, redact: Redact = _unchanged) -> None:
        super().__init__()
        self.inner = inner
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(self.inner.format(record))


class _DaemonHandler(logging.StreamHandler[TextIO]):
    """The handler ``configure_logging`` installs (a type of its own, so a second call replaces it).

    With a ``collapser``, an identical line repeated within its window is counted instead of written, and the count
    is written as one line when the window has ended (at the next line written after that, or at ``close``)."""

    def __init__(self, stream: TextIO, collapser: Collapser | None, clock: Callable[[], float]) -> None:
        super().__init__(stream)
        self.collapser = collapser
        self.clock = clock

    def emit(self, record: logging.LogRecord) -> None:
        if self.collapser is None:
            super().emit(record)
            return
        now = self.clock()
        for summary in self.collapser.due(now):
            super().emit(summary)
        if self.collapser.admit(collapse_key(record), record, now):
            super().emit(record)

    def close(self) -> None:
        if self.collapser is not None:
            for summary in self.collapser.due(self.clock(), everything=True):
                super().emit(summary)
        super().close()


def configure_logging(
    level: str,
    fmt: str = "text",
    *,
    redact: Redact = _unchanged,
    stream: TextIO | None = None,
    static: Mapping[str, Any] | None = None,
    text_format: str = TEXT_FORMAT,
    collapse: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RedactingFormatter:
    """Install the human log on the root logger and return its formatter (``.redact`` can be replaced later).

    ``collapse`` (seconds, e.g. ``log_collapse.COLLAPSE_WINDOW``; the daemon's setting) counts a line repeated
    within that window instead of writing it again (``log_collapse.Collapser``), on ``clock``.

    Raises ``ValueError`` for an unknown level or format (the config schema and argparse refuse them first).
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    inner: logging.Formatter = JsonFormatter(static) if fmt == "json" else logging.Formatter(text_format)
    formatter = RedactingFormatter(inner, redact)
    collapser = None if collapse is None else Collapser(collapse)
    handler = _DaemonHandler(stream if stream is not None else sys.stderr, collapser, clock)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _DaemonHandler)]:
        root.removeHandler(old)
        old.close()  # writes the counts it held back
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    return formatter


def config_secrets(providers: Iterable[ProviderConfig]) -> list[str]:
    """Every credential value of the configured providers (their ``env``: secret by the config schema)."""
    return [value for provider in providers for value in provider.env.values()]
