"""The test tiers (README, "Tests"), kept true by a guard.

- ``make test-fast``: neither marker. Pure tests and MockClock tests: no process is started.
- ``make test``: also ``process``: real processes of the project's own (controller, daemon, agents, plugins) and
  moto, nothing beyond pip packages and the machine's Python.
- ``make test-integration``: ``integration``: Slurm, Kubernetes, etcd and the ``capnp`` tool, built or installed
  once by ``tests/rigs/backends.py`` (``.ci/k8s-control-plane``, ``.ci/etcd-cluster``, apt).

The guard: while a test's setup or call runs, every new process (``subprocess.Popen``, and so ``trio.run_process``
and ``trio.lowlevel.open_process``, or ``os.fork``) is checked against the test's markers. A test that starts one
without ``process`` or ``integration`` fails, naming the command, even when the test caught the error the guard
raised. Teardown is not checked: pytest finalises session and module fixtures in whichever test comes last.

The order: tests marked ``long`` (30 s or more of wall time) come first, each in its place among them. Under
``make test``'s work stealing each worker takes a quarter of the run in order and idle ones take from the busy, so
a long test that started late would be the last thing running while the other workers wait.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Generator, Iterator
from typing import Any

import pytest

PROCESS_MARKERS = ("process", "integration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``long`` tests first (module docstring); the sort is stable, so every worker collects the same order."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


class ProcessNotMarked(RuntimeError):
    """A test without ``process`` or ``integration`` tried to start a process."""


class _Guard:
    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.started: dict[str, list[str]] = {}

    def check(self, what: str) -> None:
        item = self.item
        if item is None or any(item.get_closest_marker(m) for m in PROCESS_MARKERS):
            return
        self.started.setdefault(item.nodeid, []).append(what)
        raise ProcessNotMarked(
            f"{item.nodeid} started a process ({what}) but is marked neither 'process' nor 'integration' "
            "(tests/conftest.py: the tiers)"
        )


_guard = _Guard()
_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
_fork = os.fork


def _guarded_execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    _guard.check(" ".join(os.fsdecode(a) for a in argv)[:200])
    _execute_child(self, args, *rest, **kwargs)


def _guarded_fork() -> int:
    _guard.check("os.fork()")
    return _fork()


subprocess.Popen._execute_child = _guarded_execute_child  # type: ignore[attr-defined]
os.fork = _guarded_fork


@contextlib.contextmanager
def _watching(item: pytest.Item) -> Iterator[None]:
    _guard.item = item
    try:
        yield
    finally:
        _guard.item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _watching(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    started = _guard.started.pop(item.nodeid, None)
    if started and call.when != "teardown":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {len(started)} process(es) without the 'process' or 'integration' marker: "
            + "; ".join(started[:5])
        )
    return report
