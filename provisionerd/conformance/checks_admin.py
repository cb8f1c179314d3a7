"""Rows that need the controller to set demand, lose its quorum or fail over: run only with ``--admin``.

They drive the reference controller's admin API (``adminQuorum``, ``adminFailover``, ``adminSetDemand``) with the
admin certificate. Without ``--admin`` the runner reports them NOT RUN, never passed. The demand row puts the
demand back and the quorum row the quorum, however they end; the failover row leaves another replica primary (in a
new term).
"""

from __future__ import annotations

import trio

from provisionerd.conformance.context import Context
from provisionerd.conformance.peer import Peer, describe, new_instance
from provisionerd.conformance.results import CheckFailed, NotRun
from provisionerd.domain.model import DemandItem, ResourceShape
from provisionerd.wire import codec
from provisionerd.wire.messages import (
    AdminFailover,
    AdminQuorum,
    AdminSetDemand,
    DemandPage,
    FactAck,
    FactCommit,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Rejected,
)
from provisionerd.wire.paging import DEMAND_PAGE_ITEMS, PAGE_BYTES


async def no_grant_without_quorum(ctx: Context) -> str:
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
    provider = ctx.provider("grace")
    holder, _ = await ctx.provisioner([provider])
    old = await ctx.acquire(holder, provider)
    fact, _ = ctx.intent(provider, old.epoch)
    await ctx.commit(holder, fact)
    done = await ctx.admin(AdminFailover(-1))
    closed = await holder.closing(
        ctx.options.close_wait, f"the lease holder's connection to the old primary {holder.address}"
    )
    problems, said = [], [f"failover to replica {done.get('primary')} in term {done.get('term')}; old link {closed}"]
    fresh = ctx.provider("grace-fresh")  # never granted by anyone: no last grantee, so nobody's during the grace
    other, joined = await ctx.provisioner([provider, fresh], instance=new_instance())
    if joined.term <= old.epoch.term:
        problems.append(f"the new primary's term {joined.term} is not above {old.epoch.term}")
    for label, asked in [("another process", provider), ("a provider never granted, to anyone", fresh)]:
        denied = await other.request(LeaseAcquire(asked))
        if isinstance(denied, LeaseDenied) and denied.reason == "grace" and denied.retry_after_ms > 0:
            said.append(f"{label}: denied grace (retry {denied.retry_after_ms} ms)")
        else:
            problems.append(f"{label}: the acquire during the grace answered {describe(denied)}, not grace")
            if isinstance(denied, LeaseGrant):
                await other.request(LeaseRelease(asked, denied.epoch))
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


#: Demand items the paging row sets (count 0: a daemon that sees them asks for nothing).
DEMAND_ITEMS = 1100


async def _snapshot(ctx: Context, peer: Peer, after: int) -> tuple[int, list[DemandPage], list[int]]:
    """The next whole demand snapshot pushed with a seq above ``after``: its seq, pages in arrival order and their
    body sizes. ``CheckFailed`` when pages of two snapshots interleave or none completes in time."""
    pages: list[DemandPage] = []
    sizes: list[int] = []
    with trio.move_on_after(ctx.options.timeout):
        while True:
            body = await peer.framed.receive_body()
            if body is None:
                raise CheckFailed("the controller closed the connection during a demand snapshot")
            envelope = codec.decode(body)
            msg = envelope.msg
            if envelope.corr != 0 or not isinstance(msg, DemandPage) or msg.snapshot_seq <= after:
                continue
            if pages and msg.snapshot_seq != pages[0].snapshot_seq:
                raise CheckFailed(f"a page of snapshot {msg.snapshot_seq} came inside snapshot {pages[0].snapshot_seq}")
            pages.append(msg)
            sizes.append(len(body))
            if len(pages) == msg.page_count:
                return msg.snapshot_seq, pages, sizes
    raise CheckFailed(
        f"no whole demand snapshot above seq {after} within {ctx.options.timeout:g}s ({len(pages)} pages)"
    )


async def demand_paging(ctx: Context) -> str:
    peer, _ = await ctx.provisioner([ctx.provider("demand")])
    seq0, first, _ = await _snapshot(ctx, peer, -1)  # the snapshot pushed after the join: restored at the end
    before = [item for page in first for item in page.items]
    wanted = [DemandItem(f"{ctx.prefix}-d{i:04}", ResourceShape(ncpus=1 + i % 4), 0) for i in range(DEMAND_ITEMS)]
    await ctx.admin(AdminSetDemand(tuple(before) + tuple(wanted)))
    try:
        seq, pages, sizes = await _snapshot(ctx, peer, seq0)
    finally:
        with trio.CancelScope(shield=True):
            await ctx.admin(AdminSetDemand(tuple(before)))
    restored, _, _ = await _snapshot(ctx, peer, seq)
    problems = []
    if [p.page for p in pages] != list(range(len(pages))) or {p.page_count for p in pages} != {len(pages)}:
        problems.append(f"pages {[p.page for p in pages]} of {[p.page_count for p in pages]}, not 0..n-1 of n")
    for page, size in zip(pages, sizes, strict=True):
        if len(page.items) > DEMAND_PAGE_ITEMS or size > PAGE_BYTES:
            problems.append(f"page {page.page}: {len(page.items)} items, {size} bytes")
    got = sorted((item for page in pages for item in page.items), key=lambda item: item.demand_id)
    if got != sorted([*before, *wanted], key=lambda item: item.demand_id):
        problems.append(f"the pages assemble to {len(got)} items, not the {len(before) + len(wanted)} set")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"{len(before) + DEMAND_ITEMS} items as snapshot {seq} (after {seq0}) in {len(pages)} pages of"
        f" {[len(p.items) for p in pages]} items, at most {max(sizes)} bytes; superseded by snapshot {restored} (the"
        " previous demand)"
    )
