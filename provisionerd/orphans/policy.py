"""The orphan-cleanup knobs of one provider, validated once.

Pure: no I/O. ``OrphanPolicy.from_provider_config`` takes a provider's validated config
(:class:`provisionerd.config.loader.ProviderConfig`: ``join_deadline`` and its ``orphans`` table); building an
``OrphanPolicy`` validates every knob and reports *every* problem at once as a
:class:`~provisionerd.domain.errors.ConfigError`, so a bad value is fixed in one pass.

Knobs (defaults in brackets):

- ``orphan_action`` [``report``]: what to do with a machine that carries this cluster's tags but no fact (class
  ``tagged_unknown``): ``report`` only, or ``stop``/``terminate`` it once it is older than ``orphan_grace``.
- ``join_deadline`` [900 s]: a machine we requested with no joined host this long after its cloud launch time is
  ``never_joined`` and is returned automatically.
- ``orphan_grace`` [1800 s]: the minimum age (from the cloud's launch time) before ``stop``/``terminate``.
- ``max_cleanup_per_interval`` [10]: at most this many cleanups (return, stop, terminate, retire) per
  classification pass; the daemon runs one pass per interval. 0 turns automatic cleanup off.
- ``breaker_max_failures`` [3]: after this many consecutive failed cleanups the circuit breaker opens.
- ``breaker_max_share`` [0.5] and ``breaker_min_orphans`` [3]: the breaker also opens for a pass in which more
  than ``breaker_min_orphans`` machines *and* more than ``breaker_max_share`` of all the machines we know of look
  orphaned. Both must hold, so one leaked machine in a cluster of two does not trip it, while a listing that
  suddenly comes back empty (every fact a ghost) does.
- ``protect_tag`` [``provisionerd:protect``]: a machine carrying this tag key (whatever its value) is never
  touched; it is still reported.
- ``dry_run`` [false]: classify and report, act on nothing.
- ``ghost_confirmations`` [2]: consecutive listings that must miss a live fact's machine before the fact is
  retired; at least 2, so one bad listing never retires anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from provisionerd.domain.errors import ConfigError

ORPHAN_ACTIONS = ("report", "stop", "terminate")
DEFAULT_PROTECT_TAG = "provisionerd:protect"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@attrs.frozen(kw_only=True)
class OrphanPolicy:
    """One provider's orphan knobs. Invalid values raise ``ConfigError`` listing every problem."""

    orphan_action: str = "report"
    join_deadline: float = 900.0
    orphan_grace: float = 1800.0
    max_cleanup_per_interval: int = 10
    breaker_max_failures: int = 3
    breaker_max_share: float = 0.5
    breaker_min_orphans: int = 3
    protect_tag: str = DEFAULT_PROTECT_TAG
    dry_run: bool = False
    ghost_confirmations: int = 2

    def __attrs_post_init__(self) -> None:
        problems = _problems(attrs.asdict(self))
        if problems:
            raise _PolicyError("invalid orphan policy", [f"{key}: {message}" for key, message in problems], problems)

    @classmethod
    def from_provider_config(cls, provider: Any) -> OrphanPolicy:
        """The policy of one configured provider (a ``provisionerd.config.loader.ProviderConfig``).

        Reads ``provider.join_deadline`` and ``provider.orphans`` (``action``, ``grace``,
        ``max_cleanup_per_interval``, ``protect_tag``, ``dry_run``, ``ghost_confirmations`` and, when the config
        has them, ``breaker_max_failures``, ``breaker_max_share``, ``breaker_min_orphans``; absent ones keep
        their defaults). Taken duck-typed so this pure module does not depend on the config loader.
        """
        orphans = provider.orphans
        optional = {
            name: getattr(orphans, name)
            for name in ("breaker_max_failures", "breaker_max_share", "breaker_min_orphans")
            if hasattr(orphans, name)
        }
        try:
            return cls(
                orphan_action=orphans.action,
                join_deadline=provider.join_deadline,
                orphan_grace=orphans.grace,
                max_cleanup_per_interval=orphans.max_cleanup_per_interval,
                protect_tag=orphans.protect_tag,
                dry_run=orphans.dry_run,
                ghost_confirmations=orphans.ghost_confirmations,
                **optional,
            )
        except _PolicyError as error:
            where = f"providers.{provider.name}"
            paths = [f"{where}.{_CONFIG_PATHS.get(key, 'orphans.' + key)}: {message}" for key, message in error.fields]
            raise ConfigError(f"invalid orphan policy for provider {provider.name!r}", paths) from None


#: Where each knob lives in the config file, relative to the provider's table.
_CONFIG_PATHS = {"orphan_action": "orphans.action", "orphan_grace": "orphans.grace", "join_deadline": "join_deadline"}


class _PolicyError(ConfigError):
    """A ConfigError that also keeps each problem's field name, so a caller can re-home the paths."""

    def __init__(self, message: str, problems: list[str], fields: list[tuple[str, str]]) -> None:
        super().__init__(message, problems)
        self.fields = fields


def _problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem with ``values`` (a full set of knobs) as ``(field, message)``."""
    problems: list[tuple[str, str]] = []

    def bad(key: str, message: str) -> None:
        problems.append((key, f"{message}, got {values[key]!r}"))

    if values["orphan_action"] not in ORPHAN_ACTIONS:
        bad("orphan_action", f"must be one of {', '.join(ORPHAN_ACTIONS)}")
    if not _is_number(values["join_deadline"]) or values["join_deadline"] <= 0:
        bad("join_deadline", "must be a positive number of seconds")
    if not _is_number(values["orphan_grace"]) or values["orphan_grace"] < 0:
        bad("orphan_grace", "must be a number of seconds >= 0")
    if not _is_int(values["max_cleanup_per_interval"]) or values["max_cleanup_per_interval"] < 0:
        bad("max_cleanup_per_interval", "must be an integer >= 0")
    if not _is_int(values["breaker_max_failures"]) or values["breaker_max_failures"] < 1:
        bad("breaker_max_failures", "must be an integer >= 1")
    share = values["breaker_max_share"]
    if not _is_number(share) or not 0 < share <= 1:
        bad("breaker_max_share", "must be a number in (0, 1]")
    if not _is_int(values["breaker_min_orphans"]) or values["breaker_min_orphans"] < 0:
        bad("breaker_min_orphans", "must be an integer >= 0")
    if not isinstance(values["protect_tag"], str) or not values["protect_tag"]:
        bad("protect_tag", "must be a non-empty tag key")
    if not isinstance(values["dry_run"], bool):
        bad("dry_run", "must be true or false")
    if not _is_int(values["ghost_confirmations"]) or values["ghost_confirmations"] < 2:
        bad("ghost_confirmations", "must be an integer >= 2 (one listing alone never retires a fact)")
    return problems
