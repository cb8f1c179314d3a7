"""An event's fields as ``key=value`` text for the human log (logfmt), never a Python repr.

``fields_text({"provider": "sim", "tags": {"a": "b c"}, "epoch": None, "ids": ["i-1", "i-2"]})`` is
``provider=sim tags.a="b c" ids=i-1,i-2``:

- a field that is ``None`` is left out (the events stream keeps it as ``null``);
- a mapping (or an attrs value) becomes one ``key.sub=value`` pair per entry, nested the same way;
- a list, tuple or set becomes its items joined by commas (``[]`` when empty);
- ``True``/``False`` become ``true``/``false``, an enum its value, an ``Epoch`` or a path its text, any other
  value ``str()``;
- a value that is empty, or holds a space, ``=``, a quote, a backslash or a control character, is double-quoted
  with those escaped (a newline as ``\\n``), so one event stays one line that a logfmt parser splits right.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

_NEEDS_QUOTES = re.compile(r'[\s="\\]|[\x00-\x1f\x7f]')
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(text: str) -> str:
    """``text`` as a logfmt value: bare when it can be, double-quoted and escaped otherwise."""
    if text and not _NEEDS_QUOTES.search(text):
        return text
    body = "".join(_ESCAPES.get(c, c if c.isprintable() else f"\\x{ord(c):02x}") for c in text)
    return f'"{body}"'


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return ",".join(_scalar(item) for item in items) if items else "[]"
    if isinstance(value, Mapping) or (attrs.has(type(value)) and not _has_text(value)):
        # A mapping inside a list: compact JSON-like text without reprs.
        return "{" + ",".join(f"{k}:{v}" for k, v in _pairs("", value)) + "}"
    return str(value)


def _has_text(value: Any) -> bool:
    """An attrs value with a text form of its own (an ``Epoch``: ``3.1``) is written as that text."""
    return type(value).__str__ is not object.__str__


def _pairs(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    if attrs.has(type(value)) and not _has_text(value):
        value = attrs.asdict(value, recurse=False)
    if isinstance(value, Mapping):
        if not value:
            yield prefix, "{}"
        for key, item in value.items():
            if item is not None:
                yield from _pairs(f"{prefix}.{key}" if prefix else str(key), item)
        return
    yield prefix, _scalar(value)


def fields_text(fields: Mapping[str, Any]) -> str:
    """``fields`` as space-separated ``key=value`` pairs (see the module's docstring)."""
    return " ".join(f"{key}={quote(text)}" for key, text in _pairs("", fields) if key)
