"""In-memory providers with the behaviours the lifecycle tests need, built on ``FakeProvider`` (same contract)."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import trio

from provisionerd.domain.errors import ProviderCrashed
from provisionerd.testing.fake_provider import FakeProvider


class BootingProvider(FakeProvider):
    """Requests stay ``running`` (machines ``executing``) until polled ``boot_polls`` times; ``make`` limits how
    many machines a request creates (the rest never come); ``crash_after_effect`` makes the next
    ``requestMachines`` take effect and then fail as a crash (the unknown outcome op_ids exist for).

    ``poll_times`` records when each request was polled (trio clock)."""

    def __init__(self, *args: Any, boot_polls: int | float = 0, make: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.boot_polls = boot_polls
        self.make = make
        self.crash_after_effect = 0
        self.poll_times: dict[str, list[float]] = collections.defaultdict(list)
        self.call_log: list[tuple[float, str]] = []

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        self.call_log.append((trio.current_time(), action))
        if action == "requestMachines" and self.crash_after_effect:
            self.crash_after_effect -= 1
            await super().call(action, input, timeout=timeout)
            raise ProviderCrashed(self.name, action, "exited with status 70 after writing half an answer")
        return await super().call(action, input, timeout=timeout)

    def _requestMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        if self.make is not None and doc["op_id"] not in self.ops:
            doc = dict(
                doc, bootstrap=doc["bootstrap"][: self.make], template=dict(doc["template"], machineCount=self.make)
            )
        return super()._requestMachines(doc)

    def _getRequestStatus(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._getRequestStatus(doc)
        for entry in out["requests"]:
            polls = self.poll_times[entry["requestId"]]
            polls.append(trio.current_time())
            if entry["requestId"].startswith("req-") and len(polls) <= self.boot_polls:
                entry["status"] = "running"
                for machine in entry["machines"]:
                    machine["result"], machine["status"] = "executing", "pending"
        return out
