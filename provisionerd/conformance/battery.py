"""The battery: every row in the order it runs, and the runner that turns each into a ``Row``.

A row's ``rule`` names what it checks in docs/controllers.md (the deliberately broken reference controllers of
``tests/conformance`` switch those off one at a time). Rows that need ``--admin`` run last: a failover changes
the primary and starts a grace that would hold up the rows after it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import attrs
import trio

from provisionerd.conformance import checks_admin as admin
from provisionerd.conformance import checks_answers as answers
from provisionerd.conformance import checks_session as session
from provisionerd.conformance import checks_state as state
from provisionerd.conformance.context import Context, KitOptions
from provisionerd.conformance.peer import Connector
from provisionerd.conformance.results import CheckFailed, NotRun, Row, Status
from provisionerd.domain.errors import ProvisionerdError
from provisionerd.domain.model import Role

log = logging.getLogger(__name__)

#: No row may take longer than this (a controller that never answers fails the row, the kit goes on).
ROW_TIMEOUT = 180.0


@attrs.frozen
class Check:
    name: str
    rule: str
    run: Callable[[Context], Awaitable[str]]
    #: Needs ``--admin``: the row sets demand, drops the quorum or fails the controller over.
    admin: bool = False
    #: Needs a standby: NOT RUN when ``--connect`` names one address.
    standby: bool = False


CHECKS: tuple[Check, ...] = (
    Check("join accepted, version negotiated", "version_negotiation", session.join_and_version),
    Check("first frame not a join refused", "version_negotiation", session.first_frame_not_join),
    Check("redirect from a non-primary", "redirect_non_primary", session.redirect_non_primary, standby=True),
    Check("allowlist: provisioner", "role_allowlist", session.allowlist(Role.PROVISIONER)),
    Check("allowlist: worker", "role_allowlist", session.allowlist(Role.WORKER)),
    Check("allowlist: admin", "role_allowlist", session.allowlist(Role.ADMIN)),
    Check("allowlist: join role is the certificate's", "role_allowlist", session.join_role_matches_certificate),
    Check(
        "join checks in order: identity and provider names before the token",
        "join_checks",
        answers.join_checks_in_order,
    ),
    Check("frame over the size limit refused", "frame_bounds", session.oversize_frame),
    Check("malformed frames refused", "frame_bounds", session.malformed_frames),
    Check("lease grant, renew, release", "lease_rules", state.lease_grant_renew_release),
    Check("lease refusals: undeclared provider, release", "lease_rules", answers.lease_refusals),
    Check("second holder denied while the lease lives", "single_holder", state.second_holder_denied),
    Check("stale-epoch fact refused", "refuse_stale_epoch", state.stale_epoch_refused),
    Check("fact refusals: malformed, another holder, no live lease, duplicate", "fact_rules", answers.fact_refusals),
    Check("fact acks in increasing index", "fact_order", state.fact_acks_increase),
    Check("resync in log order", "resync_in_order", state.resync_in_log_order),
    Check("resync pages within page bounds", "page_bounds", state.resync_page_bounds),
    Check("demand snapshot after the resync", "demand_after_resync", state.demand_after_resync),
    Check("worker token single use", "single_use_tokens", state.token_single_use),
    Check("host states pushed", "host_pushes", state.host_state_pushes),
    Check(
        "hosts: a worker before its instance fact, the digest, a host gone",
        "host_pushes",
        answers.hosts_before_instance_fact,
    ),
    Check("history paged, ended lifecycles, own providers only", "history_scope", state.history_paged_own_providers),
    Check("demand pages assembled and superseded", "demand_paging", admin.demand_paging, admin=True),
    Check("failover: no grant without a fresh quorum", "quorum", admin.no_grant_without_quorum, admin=True),
    Check("failover: grace after promotion", "grace_after_promotion", admin.grace_after_promotion, admin=True),
    Check(
        "failover: a fact of the previous term refused",
        "refuse_stale_epoch",
        admin.previous_term_fact_refused,
        admin=True,
    ),
)


NEEDS_ADMIN = "needs --admin (the kit must set demand, drop the quorum or fail the controller over)"
NEEDS_STANDBY = "one address given: no standby to ask (give every replica's address)"


async def run_row(check: Check, ctx: Context) -> Row:
    start = trio.current_time()
    status, evidence = Status.FAIL, ""
    try:
        if check.admin and not ctx.options.admin:
            raise NotRun(NEEDS_ADMIN)
        if check.standby and len(ctx.addresses) < 2:
            raise NotRun(NEEDS_STANDBY)
        with trio.fail_after(ROW_TIMEOUT):
            evidence = await check.run(ctx)
        status = Status.PASS
    except CheckFailed as exc:
        evidence = str(exc)
    except NotRun as exc:
        status, evidence = Status.NOT_RUN, str(exc)
    except trio.TooSlowError:
        evidence = f"did not finish within {ROW_TIMEOUT:g}s"
    except (ProvisionerdError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        evidence = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a bug of the kit itself: say so, and go on with the other rows
        log.exception("the kit failed in %r", check.name)
        evidence = f"kit error (not the controller's): {type(exc).__name__}: {exc}"
    row = Row(check.name, check.rule, status, evidence, trio.current_time() - start)
    log.info("%s %s: %s", row.status.value, row.name, row.evidence)
    return row


@attrs.frozen
class Report:
    rows: tuple[Row, ...]
    seconds: float
    cleanup: str

    @property
    def ok(self) -> bool:
        return all(row.status is not Status.FAIL for row in self.rows)

    def to_json(self) -> dict[str, object]:
        counts = {s.value: sum(r.status is s for r in self.rows) for s in Status}
        return {
            "ok": self.ok,
            "counts": counts,
            "seconds": round(self.seconds, 3),
            "cleanup": self.cleanup,
            "rows": [r.to_json() for r in self.rows],
        }


async def run_battery(
    certs_dir: Path, addresses: Sequence[str], options: KitOptions, only: Sequence[str] = ()
) -> Report:
    """Run every check (or those whose name or rule is in ``only``) against the controller at ``addresses``."""
    ctx = Context(Connector(certs_dir, options.timeout), tuple(addresses), options)
    start = trio.current_time()
    rows = []
    try:
        for check in CHECKS:
            if only and check.name not in only and check.rule not in only:
                continue
            rows.append(await run_row(check, ctx))
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(60):
            cleanup = await ctx.cleanup()
    return Report(tuple(rows), trio.current_time() - start, cleanup)
