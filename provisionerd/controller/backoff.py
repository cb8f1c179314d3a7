"""Jittered exponential backoff as a pure sequence of delays.

The caller owns the clock and the sleeping; this only says how long. Randomness comes from an injected
``random.Random`` so a seeded run (tests, the simulation) repeats exactly.
"""

from __future__ import annotations

import random
from typing import Protocol


class BackoffSettings(Protocol):
    """What a ``BackoffTimer`` reads of its settings (``provisionerd.config.loader.Backoff`` is one): taken as a
    protocol so this pure sequence needs nothing of the config package."""

    @property
    def initial(self) -> float: ...

    @property
    def max(self) -> float: ...

    @property
    def multiplier(self) -> float: ...

    @property
    def jitter(self) -> float: ...


class BackoffTimer:
    """Delays ``initial * multiplier**n`` capped at ``max``, each scaled by a factor drawn from ``[1 - jitter, 1]``.

    ``next_delay()`` returns the next delay and advances; ``reset()`` starts over (call it after a success).
    """

    def __init__(self, settings: BackoffSettings, rng: random.Random) -> None:
        self._settings = settings
        self._rng = rng
        self._attempt = 0

    @property
    def attempt(self) -> int:
        return self._attempt

    def reset(self) -> None:
        self._attempt = 0

    def next_delay(self) -> float:
        s = self._settings
        # Cap the exponent so a long outage does not overflow the float before the min() applies.
        base = min(s.max, s.initial * s.multiplier ** min(self._attempt, 64))
        self._attempt += 1
        return base * (1.0 - s.jitter * self._rng.random())
