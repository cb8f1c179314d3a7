"""The config defaults that two modules read: the loader (as its values' defaults) and the cross-field checks in
``provisionerd.config.problems`` (which judge a raw document that may leave these keys out).

Their own module so that ``problems`` needs nothing of ``loader`` (which imports ``problems``): no import cycle.
"""

from __future__ import annotations

DEFAULTS: dict[str, float] = {
    "heartbeat_interval": 2.0,
    "heartbeat_timeout": 6.0,
    "backoff_initial": 0.2,
    "backoff_max": 10.0,
}
