"""The rules that leave demand unmet, as stable words for machines (the ``unmet_demand`` note's ``rules``, counted by
``provisionerd_unmet_demand_rules_total{rule}``). Pure.

Every reason ``planner.allocate`` gives for skipping or filling an offer (its own limits, the capacity back-off's
and the health's blocks) is classified here, where the reasons are made, so that nothing downstream parses a note's
text: ``incompatible`` (no compatible offer), ``max_machines``, ``max_number``, ``max_gpus`` / ``max_ncpus`` /
``max_mem_mb``, ``capacity_backoff``, ``throttled``, ``unhealthy``, ``max_unhealthy``, ``suspect``,
``provider_step_limit``, ``step_limit`` (the global one); ``no_room`` when none of them is named.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The words a reason starts with or holds, and the rule they name, most specific first.
WORDS = (
    ("max_machines", "max_machines"),
    ("maxNumber", "max_number"),
    ("max_gpus", "max_gpus"),
    ("max_ncpus", "max_ncpus"),
    ("max_mem_mb", "max_mem_mb"),
    ("capacity_unavailable", "capacity_backoff"),
    ("throttled", "throttled"),
    ("unhealthy (", "unhealthy"),
    ("protected:", "max_unhealthy"),
    ("suspect until", "suspect"),
    ("provider step limit", "provider_step_limit"),
    ("step limit", "step_limit"),
)
INCOMPATIBLE = "incompatible"
NO_ROOM = "no_room"


def rule_of(reason: str) -> str | None:
    """The rule ``reason`` names (``None``: none of them)."""
    for words, rule in WORDS:
        if words in reason:
            return rule
    return None


def rules_of(reasons: Iterable[str]) -> tuple[str, ...]:
    """The distinct rules ``reasons`` name, in the order first named; ``(no_room,)`` when none is."""
    found: dict[str, None] = {}
    for reason in reasons:
        rule = rule_of(reason)
        if rule is not None:
            found[rule] = None
    return tuple(found) or (NO_ROOM,)
