"""Each provider's ``describeProvider`` features, asked once and kept: one book for the executor (may an op be
retried under the same op_id: ``idempotentRequest``) and the offer feed (may the planner send it an all-or-nothing
item: ``allOrNothing``).

A client that knows its features without asking (``known_features``: the legacy LSF adapter, all false) is not
asked. A ``describeProvider`` that fails is not kept: the book answers ``None`` (cannot say), and every reader
takes "cannot say" as the feature's absence, the safe reading. It asks again only after a pause (``RETRY_FIRST``
seconds on trio's clock, doubling for each failure in a row up to ``RETRY_MOST``): a broken plugin is not called at
every reconcile pass for as long as it stays broken, and its warning comes once a pause, naming when it is asked
again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs
import trio

from provisionerd.domain.errors import ProviderError
from provisionerd.provider.client import ProviderReader
from provisionerd.provider.values import Features

log = logging.getLogger(__name__)

#: Seconds before a provider whose ``describeProvider`` failed is asked again; doubled per failure in a row.
RETRY_FIRST, RETRY_MOST = 10.0, 300.0


@attrs.frozen
class _Failed:
    """A provider's failed reads in a row: not asked again before ``until`` (trio's clock)."""

    until: float
    pause: float


class FeatureBook:
    def __init__(self, clients: Mapping[str, ProviderReader]) -> None:
        self._clients = clients
        self._features: dict[str, Features] = {}  # provider -> its features, once read
        self._failed: dict[str, _Failed] = {}  # provider -> its failed reads, until one succeeds

    def known(self, provider: str) -> Features | None:
        """``provider``'s features if read already (or known without asking), else ``None``; never calls."""
        features = self._features.get(provider)
        if features is None:
            client = self._clients.get(provider)
            features = None if client is None else client.known_features
        return features

    async def read(self, provider: str) -> Features | None:
        """``provider``'s features, asking ``describeProvider`` the first time (``None``: it could not say now, or
        its last read failed less than the pause ago)."""
        features = self.known(provider)
        if features is None:
            client = self._clients.get(provider)
            failed = self._failed.get(provider)
            if client is None or (failed is not None and trio.current_time() < failed.until):
                return None
            try:
                features = (await client.describe_provider()).features
            except ProviderError as exc:
                pause = RETRY_FIRST if failed is None else min(RETRY_MOST, failed.pause * 2)
                self._failed[provider] = _Failed(trio.current_time() + pause, pause)
                log.warning(
                    "describeProvider for %s failed: %s; its features are taken as absent, asked again in %g s",
                    provider,
                    exc,
                    pause,
                )
                return None
            self._failed.pop(provider, None)
        self._features[provider] = features
        return features
