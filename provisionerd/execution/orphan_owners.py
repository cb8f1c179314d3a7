"""Who returns a never-joined machine the orphan cycle finds (``returned_by`` in its evidence): see the owners in
``provisionerd.execution.orphan_cycle``'s docstring. Pure functions over findings and the fact view.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from provisionerd.orphans.model import NEVER_JOINED, Finding, Unreadable, thaw
from provisionerd.planner.fact_view import FactView

RECONCILER = "reconciler"
EXECUTOR = "executor"
ORPHAN_CYCLE = "orphan_cycle"


def returned_by(finding: Finding, open_ops: Collection[str] = ()) -> str | None:
    """Who returns a never-joined machine (see the module docstring); ``None`` for other classes. ``open_ops``:
    the op_ids of the provider's open request intents."""
    if finding.orphan_class != NEVER_JOINED:
        return None
    if finding.evidence.get("source") != "intent_tag":
        return RECONCILER
    return EXECUTOR if finding.evidence.get("op_id") in open_ops else ORPHAN_CYCLE


def open_ops_of(view: FactView | Unreadable, provider: str) -> frozenset[str]:
    if isinstance(view, Unreadable):
        return frozenset()
    return frozenset(record.intent.op_id for record in view.open_intents(provider))


def with_owners(findings: Sequence[Finding], open_ops: Collection[str] = ()) -> tuple[Finding, ...]:
    """The findings, each never-joined one with ``returned_by`` added to its evidence."""
    out = []
    for finding in findings:
        owner = returned_by(finding, open_ops)
        if owner is not None:
            finding = attrs.evolve(finding, evidence={**thaw(finding.evidence), "returned_by": owner})
        out.append(finding)
    return tuple(out)
