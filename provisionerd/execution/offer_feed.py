"""The provider offers, read with ``getAvailableTemplates`` and kept fresh for the reconcile loop.

``OfferFeed`` asks every provider's typed client for its offers (``get_available_templates``: the client turns the
validated document into ``Offer`` values, ``provisionerd.provider.contract.read_offers``), keeps the latest
successful read of each, and builds one :class:`provisionerd.planner.offers.Catalog` per change so the planner's
rankings stay cached between cycles.

A read that fails keeps the last good offers of that provider (issue 31, finding 5: dropping them stopped every
plan, returns included, until the next read a full interval later). ``fresh(providers, now)`` says whether every
named provider was read successfully within ``max_age`` seconds, ``known(providers)`` whether each was read
successfully at all. The loop plans once every provider is known, and requests machines only from providers whose
offers are fresh; returns and retirements never wait for a read. A failed provider is read again soon: after
``RETRY_FIRST`` seconds, doubling up to ``interval`` (``retry_in``); ``describe`` gives each provider's age, error
and next retry for ``status``. Failures are typed ``ProviderError`` values in ``errors``; what one means for the
planner goes to the reconcile loop on the ``feedback`` channel (``execution.feedback``: a ``Throttled`` read backs
the provider off like any other throttled call); a
provider that answers more than ``MAX_TEMPLATES`` templates is refused with ``ProviderProtocolViolation`` (bounded
memory whatever a plugin says).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.domain.errors import ProviderAnswerInvalid, ProviderError, ProviderRejected
from provisionerd.domain.model import Offer
from provisionerd.execution.feedback import tell
from provisionerd.execution.observations import provider_error_observation
from provisionerd.planner.offers import Catalog
from provisionerd.planner.state import Observation
from provisionerd.provider.client import ProviderReader
from provisionerd.provider.contract import MAX_TEMPLATES
from provisionerd.provider.contract import read_offers as templates_to_offers
from provisionerd.telemetry.events import EventLog

# ``templates_to_offers`` (one ``getAvailableTemplates`` document as offers) and ``MAX_TEMPLATES`` live with the
# typed client now; their tests still import them from here.
__all__ = ["MAX_TEMPLATES", "OfferFeed", "ProviderOffers", "templates_to_offers"]


#: The first re-read after a failed one, in seconds; it doubles on each failure in a row, up to the interval.
RETRY_FIRST = 1.0


@attrs.frozen
class ProviderOffers:
    offers: tuple[Offer, ...]
    read_at: float  # trio clock


class OfferFeed:
    """The latest offers of every provider. ``refresh()`` reads all of them; ``run`` does it every ``interval``."""

    def __init__(
        self,
        clients: Mapping[str, ProviderReader],
        events: EventLog,
        *,
        interval: float = 60.0,
        max_age: float | None = None,
        timeout: float | None = None,
        feedback: trio.MemorySendChannel[Observation] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clients = dict(clients)
        self._events = events
        self.interval = interval
        self.max_age = 3 * interval if max_age is None else max_age
        self._timeout = timeout
        self.latest: dict[str, ProviderOffers] = {}
        self.errors: dict[str, ProviderError] = {}
        self._failed: dict[str, tuple[int, float]] = {}  # provider -> (failed reads in a row, retry at: trio clock)
        self.catalog = Catalog(())
        self.version = 0
        self._changed = trio.Event()
        self._poked = trio.Event()
        self._feedback = feedback
        self._wall = wall

    def fresh(self, providers: Sequence[str], now: float | None = None) -> bool:
        """Whether every provider in ``providers`` has a successful read younger than ``max_age``."""
        now = trio.current_time() if now is None else now
        return all(p in self.latest and now - self.latest[p].read_at < self.max_age for p in providers)

    def known(self, providers: Sequence[str]) -> bool:
        """Whether every provider in ``providers`` has been read successfully at least once (its offers, however
        old, are in the catalog)."""
        return all(p in self.latest for p in providers)

    def retry_in(self, provider: str, now: float | None = None) -> float | None:
        """Seconds until a failed provider is read again (``None``: its last read succeeded)."""
        failed = self._failed.get(provider)
        now = trio.current_time() if now is None else now
        return None if failed is None else max(0.0, failed[1] - now)

    def describe(self, provider: str, now: float | None = None) -> dict[str, Any]:
        """What ``status`` shows of ``provider``'s offers: their age, whether they are stale (older than
        ``max_age``: no request is made from them), the last read's error and the next retry."""
        now = trio.current_time() if now is None else now
        latest, error = self.latest.get(provider), self.errors.get(provider)
        doc: dict[str, Any] = {"read": latest is not None}
        if latest is not None:
            doc.update(age_s=round(now - latest.read_at, 1), templates=len(latest.offers))
            doc["stale"] = now - latest.read_at >= self.max_age
        if error is not None:
            failed = self._failed.get(provider, (1, now))
            doc.update(error=f"{type(error).__name__}: {error.detail}"[:200], failures=failed[0])
            doc["retry_in_s"] = round(max(0.0, failed[1] - now), 1)
        return doc

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def refresh_soon(self) -> None:
        """Ask ``run`` for a read now instead of at the next interval."""
        self._poked.set()

    async def refresh(self, providers: Sequence[str] | None = None) -> dict[str, ProviderError]:
        """Read the given providers (by default all) concurrently; return the failures of this read."""
        names = list(self._clients) if providers is None else [p for p in providers if p in self._clients]
        failures: dict[str, ProviderError] = {}
        changed = False

        async def read(name: str) -> None:
            try:
                offers = await self._clients[name].get_available_templates(timeout=self._timeout)
            except ProviderError as exc:
                failures[name] = exc
                return
            previous = self.latest.get(name)
            self.latest[name] = ProviderOffers(offers, trio.current_time())
            self.errors.pop(name, None)
            self._failed.pop(name, None)
            if previous is None or previous.offers != offers:
                nonlocal changed
                changed = True
                self._events.emit("offers", provider=name, templates=len(offers))

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(read, name)
        now = trio.current_time()
        for name, exc in failures.items():
            self.errors[name] = exc  # the last good offers stay (see the module docstring)
            in_a_row = self._failed.get(name, (0, now))[0] + 1
            retry = min(self.interval, RETRY_FIRST * 2 ** min(in_a_row - 1, 30))
            self._failed[name] = (in_a_row, now + retry)
            self._events.emit(
                "offers_failed",
                provider=name,
                error=type(exc).__name__,
                code=exc.code if isinstance(exc, ProviderRejected) else None,
                detail=exc.detail,
                # A refused answer: where and which rule (never the value).
                path=exc.path if isinstance(exc, ProviderAnswerInvalid) else None,
                rule=exc.rule if isinstance(exc, ProviderAnswerInvalid) else None,
                failures=in_a_row,
                retry_in=retry,
                kept=name in self.latest,
            )
            # What the failure means for the planner, as for any call (``throttled`` backs off; ``auth_failed``,
            # ``invalid_request``, ``quota_exceeded``: unhealthy), to the reconcile loop (``execution.feedback``).
            obs = provider_error_observation(name, "", exc, self._wall())
            if obs is not None:
                tell(self._feedback, obs)
        if changed:
            self._rebuild()
        self._changed.set()  # fresh() may have changed even when the offers did not
        self._changed = trio.Event()
        return failures

    def _rebuild(self) -> None:
        offers = [o for name in sorted(self.latest) for o in self.latest[name].offers]
        self.catalog = Catalog(offers)
        self.version += 1

    async def run(
        self,
        *,
        skip: Callable[[str], bool] = lambda provider: False,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read every provider at once, then every ``interval`` (or sooner after ``refresh_soon``); a provider whose
        read failed is read again at its retry time in between. ``skip`` names the providers left out (the
        reconcile loop's unhealthy ones, read only by their probe: ``refresh([provider])``). Until cancelled."""
        task_status.started()
        names: list[str] | None = None  # None: every provider (a full read)
        next_full = trio.current_time()
        while True:
            self._poked = trio.Event()
            if names is None:
                next_full = trio.current_time() + self.interval
                names = [p for p in self._clients if not skip(p)]
            await self.refresh(names)
            retries = [at for name, (_, at) in self._failed.items() if not skip(name)]
            with trio.move_on_at(min([next_full, *retries])):
                await self._poked.wait()
            now = trio.current_time()
            if self._poked.is_set() or now >= next_full:
                names = None
            else:
                names = [n for n, (_, at) in self._failed.items() if at <= now and not skip(n)]
