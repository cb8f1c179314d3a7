"""The persistent transport's tests (``test_persistent*.py``): a client with fast restarts on the plugin of the
``config`` fixture (conftest.py), which answers as each request's id tells it (``ok:X``, ``sleep:S:X``, ``crash``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from provisionerd.provider.persistent import Backoff, open_persistent_provider

#: Restart back-offs short enough for a test to see several.
FAST = Backoff(initial=0.05, factor=2, maximum=0.5, reset_after=30)


def run_with(config, body: Callable[[Any], Awaitable[Any]]) -> Any:
    """``await body(client)`` on an open persistent client, in a trio run of its own."""

    async def main():
        async with open_persistent_provider(config, backoff=FAST) as client:
            return await body(client)

    return trio.run(main)


def status(client, rid: str, **kw):
    return client.call("getRequestStatus", {"requests": [{"requestId": rid}]}, **kw)
