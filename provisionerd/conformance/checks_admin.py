"""Rows that need the controller to lose its quorum or fail over: run only with ``--admin``.

They drive the reference controller's admin API (``adminQuorum``, ``adminFailover``) with the admin certificate.
Without ``--admin`` they are reported NOT RUN, never passed. The quorum row restores the quorum however it ends;
the failover row leaves another replica primary (in a new term).
"""

from __future__ import annotations

import trio

from provisionerd.conformance.context import Context
from provisionerd.conformance.peer import describe, new_instance
from provisionerd.conformance.results import CheckFailed, NotRun
from provisionerd.wire.messages import (
    AdminFailover,
    AdminQuorum,
    FactAck,
    FactCommit,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Rejected,
)


def _needs_admin(ctx: Context) -> None:
    if not ctx.options.admin:
        raise NotRun("needs --admin (the kit must make the controller lose its quorum or fail over)")


async def no_grant_without_quorum(ctx: Context) -> str:
    _needs_admin(ctx)
    provider, other = ctx.provider("quorum"), ctx.provider("quorum2")
    peer, _ = await ctx.provisioner([provider, other])
    grant = await ctx.acquire(peer, provider)
    problems, said = [], []
    await ctx.admin(AdminQuorum(False))
    try:
        renew = await peer.request(LeaseRenew(provider, grant.epoch))
        acquire = await peer.request(LeaseAcquire(other))
        fact, _ = ctx.intent(provider, grant.epoch)
        commit = await peer.request(FactCommit(fact))
        for label, reply in [("renew", renew), ("acquire", acquire)]:
            if isinstance(reply, LeaseDenied) and reply.reason == "no_quorum":
                said.append(f"{label}: denied no_quorum")
            else:
                problems.append(f"{label} without a quorum answered {describe(reply)}")
        if isinstance(commit, Rejected) and commit.reason == "no_quorum":
            said.append("fact: rejected no_quorum")
        else:
            problems.append(f"a fact without a quorum answered {describe(commit)}")
            if isinstance(commit, FactAck):
                ctx.intents.append((provider, fact.op_id))
    finally:
        with trio.CancelScope(shield=True):
            await ctx.admin(AdminQuorum(True))
    renewed = await peer.request(LeaseRenew(provider, grant.epoch))
    if isinstance(renewed, LeaseGrant):
        said.append("renew after the quorum is back: granted")
        await peer.request(LeaseRelease(provider, grant.epoch))
    else:
        problems.append(f"renew after the quorum came back answered {describe(renewed)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said)


async def grace_after_promotion(ctx: Context) -> str:
    _needs_admin(ctx)
    provider = ctx.provider("grace")
    holder, _ = await ctx.provisioner([provider])
    old = await ctx.acquire(holder, provider)
    fact, _ = ctx.intent(provider, old.epoch)
    await ctx.commit(holder, fact)
    done = await ctx.admin(AdminFailover(-1))
    closed = await holder.closing(ctx.options.close_wait)
    problems, said = [], [f"failover to replica {done.get('primary')} in term {done.get('term')}; old link {closed}"]
    other, joined = await ctx.provisioner([provider], instance=new_instance())
    if joined.term <= old.epoch.term:
        problems.append(f"the new primary's term {joined.term} is not above {old.epoch.term}")
    denied = await other.request(LeaseAcquire(provider))
    if isinstance(denied, LeaseDenied) and denied.reason == "grace" and denied.retry_after_ms > 0:
        said.append(f"another process denied grace (retry {denied.retry_after_ms} ms)")
    else:
        problems.append(f"another process's acquire during the grace answered {describe(denied)}")
        if isinstance(denied, LeaseGrant):
            await other.request(LeaseRelease(provider, denied.epoch))
    again, _ = await ctx.provisioner([provider])
    start = trio.current_time()
    regrant = await again.request(LeaseAcquire(provider))
    if isinstance(regrant, LeaseGrant) and regrant.epoch > old.epoch and regrant.epoch.term > old.epoch.term:
        said.append(f"the last grantee re-granted at once: {regrant.epoch} in {trio.current_time() - start:.2f}s")
        ctx.memo["failover"] = (again, provider, old.epoch, regrant.epoch)
    else:
        problems.append(f"the last grantee's acquire after the failover answered {describe(regrant)}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said)


async def previous_term_fact_refused(ctx: Context) -> str:
    _needs_admin(ctx)
    if "failover" not in ctx.memo:
        raise NotRun("the failover row did not get the lease back in the new term")
    peer, provider, old, new = ctx.memo.pop("failover")
    stale, _ = ctx.intent(provider, old)
    reply = await peer.request(FactCommit(stale))
    await peer.request(LeaseRelease(provider, new))
    if not (isinstance(reply, Rejected) and reply.reason == "stale_epoch"):
        if isinstance(reply, FactAck):
            ctx.intents.append((provider, stale.op_id))
        raise CheckFailed(f"a fact under the previous term's {old} (current {new}) answered {describe(reply)}")
    return f"a fact under the previous term's {old} (current {new}): rejected stale_epoch"
