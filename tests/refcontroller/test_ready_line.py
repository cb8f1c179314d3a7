"""The controller's ready line reaches its log in one write (a log line of another thread, appended to the same
file between the text and its newline, made it unreadable: a start under load then looked hung)."""

from __future__ import annotations

import io
import json

from refcontroller.cli import announce


class Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_the_ready_line_is_one_write_of_one_whole_line() -> None:
    out = Writes()
    ready = {"ready": True, "listen": ["127.0.0.1:4000"], "term": 3, "incarnation": "x" * 32, "store": "etcd"}
    announce(ready, out)
    (call,) = out.calls
    assert call.endswith("\n") and call.count("\n") == 1
    assert json.loads(call) == ready
