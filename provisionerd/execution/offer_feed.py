"""The provider offers, read with ``getAvailableTemplates`` and kept fresh for the reconcile loop.

``OfferFeed`` asks every provider's typed client for its offers (``get_available_templates``: the client turns the
validated document into ``Offer`` values, ``provisionerd.provider.contract.read_offers``), keeps the latest
successful read of each, and builds one :class:`provisionerd.planner.offers.Catalog` per change so the planner's
rankings stay cached between cycles.

A read that fails keeps nothing stale: that provider's offers are dropped until the next successful read, and
``fresh(providers, now)`` says whether every named provider was read successfully within ``max_age`` seconds. The
loop plans only when it is (a cycle that could not read its inputs takes no action). Failures are typed
``ProviderError`` values in ``errors`` (and handed to ``on_failure``: a ``Throttled`` read backs the provider off
in the planner like any other throttled call); a provider that answers more than ``MAX_TEMPLATES`` templates is
refused with ``ProviderProtocolViolation`` (bounded memory whatever a plugin says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from provisionerd.domain.errors import ProviderAnswerInvalid, ProviderError, ProviderRejected
from provisionerd.domain.model import Offer
from provisionerd.planner.offers import Catalog
from provisionerd.provider.client import ProviderReader
from provisionerd.provider.contract import MAX_TEMPLATES
from provisionerd.provider.contract import read_offers as templates_to_offers
from provisionerd.telemetry.events import EventLog

# ``templates_to_offers`` (one ``getAvailableTemplates`` document as offers) and ``MAX_TEMPLATES`` live with the
# typed client now; their tests still import them from here.
__all__ = ["MAX_TEMPLATES", "OfferFeed", "ProviderOffers", "templates_to_offers"]


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
    ) -> None:
        self._clients = dict(clients)
        self._events = events
        self.interval = interval
        self.max_age = 3 * interval if max_age is None else max_age
        self._timeout = timeout
        self.latest: dict[str, ProviderOffers] = {}
        self.errors: dict[str, ProviderError] = {}
        self.catalog = Catalog(())
        self.version = 0
        self._changed = trio.Event()
        self._poked = trio.Event()
        #: Called with (provider, error) for every failed read; the reconcile loop turns a ``throttled`` one into
        #: the planner's throttle back-off, as it does for the other calls.
        self.on_failure: Callable[[str, ProviderError], None] = lambda provider, error: None
        #: Providers a full ``refresh()`` leaves out (the reconcile loop: unhealthy ones, read only by their probe,
        #: ``refresh([provider])``).
        self.skip: Callable[[str], bool] = lambda provider: False

    def fresh(self, providers: Sequence[str], now: float | None = None) -> bool:
        """Whether every provider in ``providers`` has a successful read younger than ``max_age``."""
        now = trio.current_time() if now is None else now
        return all(p in self.latest and now - self.latest[p].read_at < self.max_age for p in providers)

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def refresh_soon(self) -> None:
        """Ask ``run`` for a read now instead of at the next interval."""
        self._poked.set()

    async def refresh(self, providers: Sequence[str] | None = None) -> dict[str, ProviderError]:
        """Read the given providers (by default all but those ``skip`` names) concurrently; return the failures of
        this read."""
        if providers is None:
            names = [p for p in self._clients if not self.skip(p)]
        else:
            names = [p for p in providers if p in self._clients]
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
            if previous is None or previous.offers != offers:
                nonlocal changed
                changed = True
                self._events.emit("offers", provider=name, templates=len(offers))

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(read, name)
        for name, exc in failures.items():
            self.errors[name] = exc
            if self.latest.pop(name, None) is not None:  # never plan on offers we could not confirm
                changed = True
            self._events.emit(
                "offers_failed",
                provider=name,
                error=type(exc).__name__,
                code=exc.code if isinstance(exc, ProviderRejected) else None,
                detail=exc.detail,
                # A refused answer: where and which rule (never the value).
                path=exc.path if isinstance(exc, ProviderAnswerInvalid) else None,
                rule=exc.rule if isinstance(exc, ProviderAnswerInvalid) else None,
            )
            self.on_failure(name, exc)
        if changed:
            self._rebuild()
        self._changed.set()  # fresh() may have changed even when the offers did not
        self._changed = trio.Event()
        return failures

    def _rebuild(self) -> None:
        offers = [o for name in sorted(self.latest) for o in self.latest[name].offers]
        self.catalog = Catalog(offers)
        self.version += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read at once, then every ``interval`` (or sooner after ``refresh_soon``), until cancelled."""
        task_status.started()
        while True:
            self._poked = trio.Event()
            await self.refresh()
            with trio.move_on_after(self.interval):
                await self._poked.wait()
