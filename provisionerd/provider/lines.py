"""Splitting a byte stream into bounded lines, and reading one persistent-transport answer line.

Pure (no I/O): the persistent transport feeds chunks in and gets complete lines out, so a plugin cannot make the
daemon buffer more than ``max_line`` bytes however it writes.
"""

from __future__ import annotations

from typing import Any

import attrs

from provisionerd.provider.runtime import parse_json


class LineTooLong(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"a line exceeds {limit} bytes")


class LineSplitter:
    """Feed chunks, get complete lines (without the newline). Raises ``LineTooLong`` as soon as a line, complete
    or not, exceeds the limit. Holding partial chunks in a list keeps a long line linear, not quadratic."""

    def __init__(self, max_line: int) -> None:
        self._max = max_line
        self._partial: list[bytes] = []
        self._partial_len = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            self._partial.append(chunk)
            self._partial_len += len(chunk)
            if self._partial_len > self._max:
                raise LineTooLong(self._max)
            return []
        lines = [b"".join([*self._partial, parts[0]]) if self._partial else parts[0]]
        lines += parts[1:-1]
        tail = parts[-1]
        self._partial = [tail] if tail else []
        self._partial_len = len(tail)
        if self._partial_len > self._max or any(len(line) > self._max for line in lines):
            raise LineTooLong(self._max)
        return lines

    @property
    def has_partial(self) -> bool:
        return self._partial_len > 0


class BadFrame(ValueError):
    """A line that is not a well-formed answer (not JSON, not an object, no integer id, not exactly one of
    ``result``/``error``)."""


@attrs.frozen
class Answer:
    id: int
    result: Any = None
    error: Any = None
    is_error: bool = False


def parse_answer(line: bytes) -> Answer:
    """``{"id": <int>, "result": {...}}`` or ``{"id": <int>, "error": {...}}``; ``BadFrame`` otherwise (its
    message never quotes the line: the caller quotes a redacted snippet)."""
    try:
        frame = parse_json(line)
    except ValueError:
        raise BadFrame("a line is not JSON") from None
    if not isinstance(frame, dict):
        raise BadFrame("a line is not a JSON object")
    ident = frame.get("id")
    if not isinstance(ident, int) or isinstance(ident, bool):
        raise BadFrame("a line has no integer 'id'")
    if ("result" in frame) == ("error" in frame):
        raise BadFrame(f"the answer to id {ident} must have exactly one of 'result' and 'error'")
    if "error" in frame:
        return Answer(ident, error=frame["error"], is_error=True)
    return Answer(ident, result=frame["result"])
