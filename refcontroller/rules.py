"""The controller rules the conformance kit checks, each of which a test may switch off: deliberately broken
reference controllers, so that ``tests/conformance`` can show the kit fails each on the row naming its rule.

Every rule is on by default, and nothing but the environment variable ``REFCONTROLLER_TEST_BROKEN_RULES`` (a
comma-separated list of rule names, read once when the module is imported) switches one off. It is a test hook:
a controller started with it breaks the promises the daemon relies on (docs/controllers.md), says so in a WARNING
at start, and must never serve a real daemon. Each rule is consulted by one line at its site:

``grace_after_promotion``  ``leases.LeaseTable.acquire``: a new primary grants only to the last grantee until the
                           grace ends
``refuse_stale_epoch``     ``commits.epoch_rejection``: a fact whose epoch is not the live lease's is refused
``resync_in_order``        ``session.Session._resync``: a page's facts go in log order
``page_bounds``            ``paging.page_bounds``: a resync page holds at most 500 facts and 256 KiB
``redirect_non_primary``   ``server.ControllerServer._join``: a standby redirects every join to the primary
``role_allowlist``         ``server.ControllerServer._join`` (the Join's role is the certificate's) and
                           ``session.Session._read_loop`` (each frame's kind is in its role's allowlist)
``history_scope``          ``history.readable``: a provisioner reads the history of its Join's providers only
``join_checks``            ``server.ControllerServer._admit``: a Join's identity is judged before a worker's secret
``lease_rules``            ``replies.provisioner_reply``: a lease request for an undeclared provider is rejected
                           ``invalid``, never denied
``fact_rules``             ``cluster.Cluster.commit``: the same fact again is acked with its index before the epoch
                           rule is applied
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import attrs

log = logging.getLogger(__name__)

ENV = "REFCONTROLLER_TEST_BROKEN_RULES"


@attrs.frozen
class Rules:
    grace_after_promotion: bool = True
    refuse_stale_epoch: bool = True
    resync_in_order: bool = True
    page_bounds: bool = True
    redirect_non_primary: bool = True
    role_allowlist: bool = True
    history_scope: bool = True
    join_checks: bool = True
    lease_rules: bool = True
    fact_rules: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(a.name for a in attrs.fields(cls))

    @classmethod
    def without(cls, broken: str) -> Rules:
        """Every rule on except the comma-separated ``broken`` ones. ``ValueError`` naming an unknown rule."""
        off = [name.strip() for name in broken.split(",") if name.strip()]
        unknown = [name for name in off if name not in cls.names()]
        if unknown:
            raise ValueError(f"{ENV}: no rule {', '.join(map(repr, unknown))}; the rules are {', '.join(cls.names())}")
        return cls(**dict.fromkeys(off, False))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Rules:
        rules = cls.without(environ.get(ENV, ""))
        off = [name for name in cls.names() if not getattr(rules, name)]
        if off:
            log.warning("DELIBERATELY BROKEN for tests (%s): rules off: %s", ENV, ", ".join(off))
        return rules


#: The rules of this process.
RULES = Rules.from_env()
