"""Rows about leases, facts, resync, worker tokens and host states (the provisioner's side of §5 and §6)."""

from __future__ import annotations

import hashlib
import math

import trio

from provisionerd.conformance.context import IDENTITY, Context
from provisionerd.conformance.peer import Peer, describe, join, join_primary, new_instance
from provisionerd.conformance.results import CheckFailed, NotRun
from provisionerd.domain.errors import FrameOverBounds
from provisionerd.domain.model import Epoch, HostStatus, InstanceFact, Returned, ReturnIntent, Role
from provisionerd.wire import codec
from provisionerd.wire.messages import (
    Ack,
    DemandPage,
    ErrorMsg,
    FactAck,
    FactCommit,
    Heartbeat,
    HeartbeatAck,
    HistoryPage,
    HistoryQuery,
    HostStatePush,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Message,
    Rejected,
    ResyncPage,
    ResyncRequest,
    WorkerStatus,
)
from provisionerd.wire.paging import PAGE_BYTES, RESYNC_PAGE_ITEMS

# --- leases ---------------------------------------------------------------------------------------------------


async def lease_grant_renew_release(ctx: Context) -> str:
    provider = ctx.provider("lease")
    peer, _ = await ctx.provisioner([provider])
    first = await ctx.acquire(peer, provider)
    if first.ttl_ms <= 0 or first.epoch.term < 1 or first.epoch.seq < 1:
        raise CheckFailed(f"grant {describe(first)}: ttlMs and both epoch parts must be positive")
    again = await peer.request(LeaseAcquire(provider))
    if not (isinstance(again, LeaseGrant) and again.epoch == first.epoch):
        raise CheckFailed(f"a second acquire by the holder answered {describe(again)}, not the same epoch")
    renewed = await peer.request(LeaseRenew(provider, first.epoch))
    if not (isinstance(renewed, LeaseGrant) and renewed.epoch == first.epoch):
        raise CheckFailed(f"renew of {first.epoch} answered {describe(renewed)}")
    wrong = Epoch(first.epoch.term, first.epoch.seq + 1000)
    stale = await peer.request(LeaseRenew(provider, wrong))
    if not (isinstance(stale, LeaseDenied) and stale.reason in ("stale_epoch", "no_lease")):
        raise CheckFailed(f"renew with a wrong epoch {wrong} answered {describe(stale)}")
    released = await peer.request(LeaseRelease(provider, first.epoch))
    if not isinstance(released, Ack):
        raise CheckFailed(f"release of {first.epoch} answered {describe(released)}")
    after = await peer.request(LeaseRenew(provider, first.epoch))
    if not (isinstance(after, LeaseDenied) and after.reason == "no_lease"):
        raise CheckFailed(f"renew after the release answered {describe(after)}, not noLease")
    second = await ctx.acquire(peer, provider)
    if not second.epoch > first.epoch:
        raise CheckFailed(f"the grant after the release has epoch {second.epoch}, not above {first.epoch}")
    await peer.request(LeaseRelease(provider, second.epoch))
    return (
        f"granted {first.epoch} (ttl {first.ttl_ms} ms), re-acquire same epoch, renewed, wrong epoch"
        f" {stale.reason}, released (ack), renew after release no_lease, next grant {second.epoch}"
    )


async def second_holder_denied(ctx: Context) -> str:
    provider = ctx.provider("holder")
    a, _ = await ctx.provisioner([provider])
    b, _ = await ctx.provisioner([provider], instance=new_instance())  # same identity, another process start
    grant = await ctx.acquire(a, provider)
    problems = []
    denied = await b.request(LeaseAcquire(provider))
    if not (isinstance(denied, LeaseDenied) and denied.reason == "held"):
        problems.append(f"another process's acquire answered {describe(denied)}, not held")
    elif not 0 < denied.retry_after_ms <= grant.ttl_ms:
        problems.append(f"held with retryAfterMs {denied.retry_after_ms}, not within (0, {grant.ttl_ms}]")
    renew = await b.request(LeaseRenew(provider, grant.epoch))
    if isinstance(renew, LeaseGrant):
        problems.append(f"another process renewed the holder's epoch {grant.epoch}")
    release = await b.request(LeaseRelease(provider, grant.epoch))
    still = await a.request(LeaseRenew(provider, grant.epoch))
    if not isinstance(still, LeaseGrant):
        problems.append(f"after another process's release ({describe(release)}), the holder's renew: {describe(still)}")
    fact, _ = ctx.intent(provider, grant.epoch)
    foreign = await b.request(FactCommit(fact))
    if not isinstance(foreign, Rejected):
        problems.append(f"a fact from another process under the holder's epoch answered {describe(foreign)}")
    await a.request(LeaseRelease(provider, grant.epoch))
    taken = await b.request(LeaseAcquire(provider))
    if not (isinstance(taken, LeaseGrant) and taken.epoch > grant.epoch):
        problems.append(f"after the holder released, the other's acquire answered {describe(taken)}")
    else:
        await b.request(LeaseRelease(provider, taken.epoch))
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"held by A at {grant.epoch}: B denied {describe(denied)}, B's renew {describe(renew)}, B's release left"
        f" A's lease, B's fact {describe(foreign)}; after A released B got {describe(taken)}"
    )


# --- facts ----------------------------------------------------------------------------------------------------


async def stale_epoch_refused(ctx: Context) -> str:
    provider = ctx.provider("stale")
    peer, _ = await ctx.provisioner([provider])
    old = await ctx.acquire(peer, provider)
    fact, _ = ctx.intent(provider, old.epoch)
    await ctx.commit(peer, fact)
    await peer.request(LeaseRelease(provider, old.epoch))
    new = await ctx.acquire(peer, provider)
    problems, said = [], []
    for label, epoch in [
        ("the previous epoch", old.epoch),
        ("an epoch never granted", Epoch(new.epoch.term, new.epoch.seq + 1000)),
    ]:
        fact, _ = ctx.intent(provider, epoch)
        reply = await peer.request(FactCommit(fact))
        if isinstance(reply, Rejected) and reply.reason == "stale_epoch":
            said.append(f"{label} {epoch}: rejected stale_epoch")
        else:
            problems.append(f"a fact under {label} {epoch} (current {new.epoch}) answered {describe(reply)}")
            if isinstance(reply, FactAck):
                ctx.intents.append((provider, fact.op_id))
    current, _ = ctx.intent(provider, new.epoch)
    await ctx.commit(peer, current)
    await peer.request(LeaseRelease(provider, new.epoch))
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said) + f"; the current {new.epoch}: acked"


async def fact_acks_increase(ctx: Context) -> str:
    provider = ctx.provider("acks")
    peer, _ = await ctx.provisioner([provider])
    grant = await ctx.acquire(peer, provider)
    facts = [ctx.intent(provider, grant.epoch)[0] for _ in range(5)]
    acks = [await ctx.commit_ack(peer, fact) for fact in facts]
    indexes = [ack.index for ack in acks]
    if any(b <= a for a, b in zip(indexes, indexes[1:], strict=False)):
        raise CheckFailed(f"acks {indexes} are not strictly increasing")
    again = await peer.request(FactCommit(facts[2]))
    if not (isinstance(again, FactAck) and again.index == indexes[2]):
        raise CheckFailed(f"the same fact again (a retry) answered {describe(again)}, not its index {indexes[2]}")
    first_at = acks[2].committed_at  # 0 from a controller that does not keep commit times: then 0 again
    if again.committed_at != first_at and not (math.isnan(again.committed_at) and math.isnan(first_at)):
        raise CheckFailed(
            f"the same fact again (a retry) answered committedAt {again.committed_at!r}, not its first ack's"
            f" {first_at!r}"
        )
    other, reply = await ctx.provisioner([provider], instance=new_instance())
    await other.aclose()
    if reply.last_index < indexes[-1]:
        raise CheckFailed(f"a later join says lastIndex {reply.last_index}, below the acked {indexes[-1]}")
    beat = await peer.request(Heartbeat(1))
    digest = beat.last_index if isinstance(beat, HeartbeatAck) else -1
    if digest not in (0, indexes[-1]):
        raise CheckFailed(f"the heartbeat digest says lastIndex {digest} for the provider, not {indexes[-1]}")
    await peer.request(LeaseRelease(provider, grant.epoch))
    return f"acks {indexes}; a retry got {again.index} again; a later join's lastIndex {reply.last_index}"


# --- resync ---------------------------------------------------------------------------------------------------


#: Big intents (each ~145 KB encoded): three of them cannot share one 256 KiB page; and more small ones than one
#: page may hold (500 items).
BIG_INTENTS, BIG_COUNT, BIG_REF = 3, 600, 150
SMALL_INTENTS = RESYNC_PAGE_ITEMS + 1


#: The pages, their body sizes, the acked indexes, what followed the last page, the pages refused undecoded.
Resynced = tuple[list[ResyncPage], list[int], list[int], str, list[str]]


def _page_count(body: bytes) -> int:
    """``ResyncPage.pageCount`` of a page too big to decode, read with pycapnp alone (no list is traversed)."""
    with codec.schema().Frame.from_bytes(body, traversal_limit_in_words=64) as frame:
        return int(frame.body.resyncPage.pageCount)


async def _resync(ctx: Context) -> Resynced:
    """The resync the three resync rows look at (once per run)."""
    if "resync" not in ctx.memo:
        try:
            ctx.memo["resync"] = await resync_with(ctx, ctx.provider("resync"), big_first=False)
        except CheckFailed as exc:  # the other resync rows say the same, without committing it all again
            ctx.memo["resync"] = exc
    result: Resynced | CheckFailed = ctx.memo["resync"]
    if isinstance(result, CheckFailed):
        raise CheckFailed(f"the resync setup failed: {result}")
    return result


async def resync_with(
    ctx: Context, provider: str, big_first: bool, small: int = SMALL_INTENTS, big: int = BIG_INTENTS
) -> Resynced:
    """Commit ``small`` small and ``big`` big intents on ``provider`` (the small ones first unless ``big_first``),
    resync it; the pages, their body sizes, the acked indexes, and what followed the last page.

    The rows commit the small ones first: the reference controller pages by the facts' JSON size, which a fact
    full of short strings exceeds when encoded, so a big fact followed by 499 small ones makes a page above 256 KiB
    (``tests/conformance/test_kit_reference.py`` keeps that known bug in sight)."""
    peer, _ = await ctx.provisioner([provider])
    grant = await ctx.acquire(peer, provider)
    bigs = [ctx.intent(provider, grant.epoch, BIG_COUNT, BIG_REF)[0] for _ in range(big)]
    smalls = [ctx.intent(provider, grant.epoch)[0] for _ in range(small)]
    acked = await ctx.commit_renewing(peer, provider, grant.epoch, bigs + smalls if big_first else smalls + bigs)
    peer.pushes.clear()
    corr = await peer.send(ResyncRequest((provider,)))
    pages: list[ResyncPage] = []
    sizes: list[int] = []
    refused: list[str] = []
    expected: int | None = None
    after = "nothing"
    with trio.move_on_after(ctx.options.timeout * 3) as scope:
        while len(pages) + len(refused) < (pages[0].page_count if pages else expected or 1e9):
            body = await peer.framed.receive_body()
            if body is None:
                raise CheckFailed(f"the controller closed after {len(pages)} resync pages")
            try:
                envelope = codec.decode(body)
            except FrameOverBounds as exc:  # a page over the list caps our reader (and the daemon's) accepts
                if codec.peek(body).corr != corr:
                    raise
                refused.append(f"a page of {len(body)} bytes our reader refuses: {exc}")
                expected = expected if expected is not None else _page_count(body)
                continue
            if envelope.corr == corr and isinstance(envelope.msg, ResyncPage):
                pages.append(envelope.msg)
                sizes.append(len(body))
            elif envelope.corr == corr:
                raise CheckFailed(f"the resync answered {describe(envelope.msg)}")
            elif envelope.corr == 0 and not pages:
                pass  # a push before the first page
            elif envelope.corr == 0:
                peer.pushes.append(envelope.msg)
        seq: int | None = None
        got: set[int] = set()
        while True:  # a whole demand snapshot after the last page (pushes kept from between pages do not count)
            msg = await peer.wait_push(DemandPage)
            assert isinstance(msg, DemandPage)
            if seq != msg.snapshot_seq:
                seq, got = msg.snapshot_seq, set()
            got.add(msg.page)
            if len(got) == msg.page_count:
                after = f"demand snapshot seq {seq} ({msg.page_count} page(s))"
                break
    if scope.cancelled_caught and not pages:
        raise CheckFailed("no resync page")
    if scope.cancelled_caught:
        after = f"no whole demand snapshot within {ctx.options.timeout * 3:g}s"
    await peer.request(LeaseRelease(provider, grant.epoch))
    return pages, sizes, acked, after, refused


async def resync_in_log_order(ctx: Context) -> str:
    pages, _, acked, _, refused = await _resync(ctx)
    if refused:
        raise NotRun(f"{len(refused)} page(s) could not be read (see the page-bounds row)")
    numbers = [p.page for p in pages]
    if numbers != list(range(len(pages))) or {p.page_count for p in pages} != {len(pages)}:
        raise CheckFailed(f"pages numbered {numbers} of {[p.page_count for p in pages]}")
    indexes = [c.index for p in pages for c in p.facts]
    if any(b <= a for a, b in zip(indexes, indexes[1:], strict=False)):
        raise CheckFailed(f"fact indexes in page order {indexes} are not increasing")
    missing = sorted(set(acked) - set(indexes))
    if missing:
        raise CheckFailed(f"live facts {missing} (acked, open intents) are not in the resync")
    return f"{len(pages)} pages, {len(indexes)} facts in increasing index {indexes[0]}..{indexes[-1]}"


async def resync_page_bounds(ctx: Context) -> str:
    pages, sizes, _, _, refused = await _resync(ctx)
    if refused:
        raise CheckFailed("; ".join(refused))
    return page_bound_evidence(pages, sizes)


def page_bound_evidence(pages: list[ResyncPage], sizes: list[int]) -> str:
    problems = []
    for page, size in zip(pages, sizes, strict=True):
        items = len(page.facts) + len(page.hosts)
        if items > RESYNC_PAGE_ITEMS:
            problems.append(f"page {page.page} holds {items} items (at most {RESYNC_PAGE_ITEMS})")
        if size > PAGE_BYTES:
            problems.append(f"page {page.page} is {size} bytes (at most {PAGE_BYTES})")
    if problems:
        raise CheckFailed("; ".join(problems))
    counts = [len(p.facts) + len(p.hosts) for p in pages]
    return f"{len(pages)} pages of {sizes} bytes and {counts} items (at most {PAGE_BYTES}, {RESYNC_PAGE_ITEMS})"


async def demand_after_resync(ctx: Context) -> str:
    after = (await _resync(ctx))[3]
    if after.startswith("no "):
        raise CheckFailed(after + " after the last resync page")
    return after + " after the last page"


# --- workers --------------------------------------------------------------------------------------------------


async def token_single_use(ctx: Context) -> str:
    if not ctx.connector.has_role(Role.WORKER):
        raise NotRun(f"no worker certificate in {ctx.connector.certs_dir}")
    tokens = await ctx.worker_tokens("tokens", 3)  # 0 and 1 join; 2 is another instance's, never used
    ref0, ref1 = tokens.refs[0], tokens.refs[1]
    said = []

    async def attempt(ref: str, token: str, label: str, want_ok: bool) -> None:
        peer, reply = await join_primary_or_reply(ctx, Join(Role.WORKER, IDENTITY, instance_ref=ref, token=token))
        ok = isinstance(reply, JoinReply) and reply.accepted
        try:
            if ok:  # a frame after the reply: the worker has its credential (protocol §4), the token is spent
                await peer.request(Heartbeat(1))
        finally:
            await peer.aclose()
        refused = isinstance(reply, ErrorMsg) and reply.code == "token_invalid"
        if (want_ok and not ok) or (not want_ok and not refused):
            raise CheckFailed(f"{label}: {describe(reply)}")
        said.append(f"{label}: {'accepted' if ok else 'token_invalid'}")

    await attempt(ref0, tokens.tokens[0], "its token", True)
    await attempt(ref0, tokens.tokens[0], "the same token again", False)
    await attempt(ref1, tokens.tokens[2], "another instance's token", False)
    await attempt(ref1, "not-a-token-" + hashlib.sha256(ref1.encode()).hexdigest()[:20], "a made-up token", False)
    await attempt(ref1, tokens.tokens[1], "its own token after those refusals", True)
    return "; ".join(said)


async def join_primary_or_reply(ctx: Context, msg: Join) -> tuple[Peer, Message]:
    """Join the primary (found with a provisioner join); the peer and the answer, refused or not."""
    address = ctx.peers[-1].address if ctx.peers else (await ctx.provisioner([ctx.provider("join")]))[0].address
    return await join(ctx.connector, address, msg)


async def host_state_pushes(ctx: Context) -> str:
    if not ctx.connector.has_role(Role.WORKER):
        raise NotRun(f"no worker certificate in {ctx.connector.certs_dir}")
    tokens = await ctx.worker_tokens("hosts", 1)
    holder, _ = await ctx.provisioner([tokens.provider])
    ref = tokens.refs[0]
    worker, _ = await join_primary(
        ctx.connector, ctx.addresses, Join(Role.WORKER, IDENTITY, instance_ref=ref, token=tokens.tokens[0])
    )
    ctx.peers.append(worker)
    seen = []
    # Then a spot interruption notice (protocol §6.4 "Reclaim notices"), kept while the status stays, and last a
    # re-probe after the join (§6.4 "Health after join"): the host's capabilities replaced, stamped probedAt.
    notice = WorkerStatus(HostStatus.BUSY, reclaim_at=KIT_RECLAIM_AT, rebalance_at=KIT_REBALANCE_AT)
    probed = WorkerStatus(HostStatus.BUSY, capabilities=KIT_REPROBE, probed_at=KIT_PROBED_AT)
    for step, report in enumerate((None, WorkerStatus(HostStatus.BUSY), notice, probed)):
        if report is not None:
            ack = await worker.request(report)
            if not isinstance(ack, Ack):
                raise CheckFailed(f"{describe(report)} answered {describe(ack)}")
        want = HostStatus.JOINED if report is None else report.status
        deadline = trio.current_time() + ctx.options.timeout
        while True:
            push = await holder.wait_push(HostStatePush, max(0.0, deadline - trio.current_time()))
            assert isinstance(push, HostStatePush)
            mine = [h for h in push.hosts if h.instance_ref == ref]
            if not mine or mine[-1].status is not want:
                continue
            host = mine[-1]
            if step < 2:
                seen.append(f"{want.value} (seq {push.seq})")
                break
            if step == 2 and (host.reclaim_at, host.rebalance_at) == (KIT_RECLAIM_AT, KIT_REBALANCE_AT):
                seen.append(f"its reclaim notice, reclaimAt {host.reclaim_at:.0f} (seq {push.seq})")
                break
            if step == 3 and (dict(host.capabilities), host.probed_at) == (KIT_REPROBE, KIT_PROBED_AT):
                seen.append(f"its re-probe, probedAt {host.probed_at:.0f} (seq {push.seq})")
                break
    return f"the provisioner of {tokens.provider} was pushed {ref}: " + ", then ".join(seen)


#: The notice the kit's worker reports: times in the past are fine (the controller only relays them).
KIT_RECLAIM_AT = 1700000120.0
KIT_REBALANCE_AT = 1700000000.0
#: The re-probe the kit's worker reports after its join: a GPU probe that started failing.
KIT_REPROBE = {"ngpus": "!exit 9"}
KIT_PROBED_AT = 1700000300.0


# --- history (§6.6) -------------------------------------------------------------------------------------------


async def history_paged_own_providers(ctx: Context) -> str:
    """An ended lifecycle stays readable through the history query, page by page in log order within the page
    bounds; a provisioner reading a provider its Join did not declare is refused and keeps its link."""
    provider = ctx.provider("history")
    peer, reply = await ctx.provisioner([provider])
    if not reply.history:  # the daemon sends the query only to a controller that announced it
        raise CheckFailed("the accepted JoinReply does not say history: true, so no provisioner will ask (§4, §6.6)")
    grant = await ctx.acquire(peer, provider)
    intent, _ = ctx.intent(provider, grant.epoch)
    ref, machine = intent.instance_refs[0], f"{intent.op_id}-machine"
    back = f"{intent.op_id}-back"
    ended = [
        intent,
        InstanceFact(provider, grant.epoch, intent.op_id, ref, machine, "kit-template", intent.token_hashes[0]),
        ReturnIntent(provider, grant.epoch, back, (machine,), "kit"),
        Returned(provider, grant.epoch, back, (machine,)),
    ]
    acked = await ctx.commit_many(peer, ended)
    acked += [await ctx.commit(peer, ctx.intent(provider, grant.epoch)[0])]  # and one live intent
    got: list[int] = []
    pages, after, until = 0, 0, 0
    while True:
        corr = await peer.send(HistoryQuery((provider,), after, until, 2))
        body = await peer.framed.receive_body()  # the reply, as bytes: its size is part of the check
        if body is None:
            raise CheckFailed(f"the controller closed after {pages} history pages")
        envelope = codec.decode(body)
        if envelope.corr != corr or not isinstance(envelope.msg, HistoryPage):
            raise CheckFailed(f"HistoryQuery answered {describe(envelope.msg)} (corr {envelope.corr}, not {corr})")
        page, pages = envelope.msg, pages + 1
        if len(page.facts) > 2 or len(body) > PAGE_BYTES:
            raise CheckFailed(f"a history page of {len(page.facts)} facts and {len(body)} bytes (asked for 2)")
        got += [c.index for c in page.facts]
        if page.done or pages > 2 * len(acked) + 2:
            break
        after, until = page.next_after, page.until_index
    if got != acked:
        raise CheckFailed(f"history pages gave indexes {got}, not the {len(acked)} acked in order {acked}")
    other = ctx.provider("history-other")
    refused = await peer.request(HistoryQuery((other,)))
    if not (isinstance(refused, Rejected) and refused.reason == "invalid"):
        raise CheckFailed(f"a history query of a provider not in the Join answered {describe(refused)}")
    beat = await peer.request(Heartbeat(1))
    if not isinstance(beat, HeartbeatAck):
        raise CheckFailed(f"after the refused history query a heartbeat answered {describe(beat)}")
    await peer.request(LeaseRelease(provider, grant.epoch))
    return f"{len(got)} facts (a returned machine's lifecycle and a live intent) in {pages} pages of <= 2; " + (
        f"another provider's history refused: {refused.detail[:80]}"
    )
