"""Shared helpers for the daemon's tests: run a coroutine on a MockClock, build a keeper on a fake controller."""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from rigs import clock
from rigs.memory import open_memory_controller

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper, LeaseTransport
from provisionerd.telemetry.events import EventLog


@pytest.fixture
def mock_run() -> Callable[[Callable[[], Awaitable[Any]]], Any]:
    """``rigs.clock.mock_run``: an async function on a bounded ``MockClock`` from virtual time 0."""
    return clock.mock_run


@pytest.fixture
def make_keeper() -> Callable[..., LeaseKeeper]:
    def make(provider: str, transport: LeaseTransport, events: EventLog | None = None, **kwargs: Any) -> LeaseKeeper:
        return LeaseKeeper(
            provider,
            transport,
            margin=kwargs.pop("margin", 2.0),
            backoff=kwargs.pop("backoff", Backoff(initial=0.5, max=8.0, multiplier=2.0, jitter=0.5)),
            rng=random.Random(kwargs.pop("seed", 7)),
            events=events if events is not None else EventLog(),
            **kwargs,
        )

    return make


@pytest.fixture
def memory_controller(tmp_path):
    """``async with memory_controller(replicas=3, ttl=30, check_interval=5) as net:`` a reference controller in
    this trio run, reached through ``net.connect`` (``rigs.memory``: in-memory streams, role given, no TLS)."""
    return functools.partial(open_memory_controller, tmp_path)
