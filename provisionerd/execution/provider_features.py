"""Each provider's ``describeProvider`` features, asked once and kept: one book for the executor (may an op be
retried under the same op_id: ``idempotentRequest``) and the offer feed (may the planner send it an all-or-nothing
item: ``allOrNothing``).

A client that knows its features without asking (``known_features``: the legacy LSF adapter, all false) is not
asked. A ``describeProvider`` that fails is not kept: the book answers ``None`` (cannot say) and asks again next
time, and every reader takes "cannot say" as the feature's absence, the safe reading.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from provisionerd.domain.errors import ProviderError
from provisionerd.provider.client import ProviderReader
from provisionerd.provider.values import Features

log = logging.getLogger(__name__)


class FeatureBook:
    def __init__(self, clients: Mapping[str, ProviderReader]) -> None:
        self._clients = clients
        self._features: dict[str, Features] = {}  # provider -> its features, once read

    def known(self, provider: str) -> Features | None:
        """``provider``'s features if read already (or known without asking), else ``None``; never calls."""
        features = self._features.get(provider)
        if features is None:
            client = self._clients.get(provider)
            features = None if client is None else client.known_features
        return features

    async def read(self, provider: str) -> Features | None:
        """``provider``'s features, asking ``describeProvider`` the first time (``None``: it could not say now)."""
        features = self.known(provider)
        if features is None:
            client = self._clients.get(provider)
            if client is None:
                return None
            try:
                features = (await client.describe_provider()).features
            except ProviderError as exc:
                log.warning("describeProvider for %s failed: %s; its features are taken as absent", provider, exc)
                return None
        self._features[provider] = features
        return features
