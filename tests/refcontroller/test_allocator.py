"""``refcontroller serve`` from a command line runs on glibc's malloc (``refcontroller.allocator``)."""

from __future__ import annotations

import sys

import pytest

from refcontroller import allocator


def test_serve_re_executes_itself_with_malloc_unless_the_operator_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(allocator.os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    allocator.serve_with_malloc(["serve", "--data", "d"])
    [(path, argv, env)] = calls
    assert path == sys.executable and argv == [sys.executable, "-m", "refcontroller", "serve", "--data", "d"]
    assert env["PYTHONMALLOC"] == "malloc"
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc")  # the operator's choice, and what the re-executed process sees
    allocator.serve_with_malloc(["serve"])
    assert len(calls) == 1
