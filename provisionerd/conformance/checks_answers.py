"""Rows about the exact answer to a request the controller refuses (issue 33: the points an independent controller
written from the documents got wrong or had to guess).

Each row pins one answer that docs/protocol.md now states: the order of the Join's checks (§7), the reply to a
lease request for a provider the Join did not declare and to a release that is refused (§5), and the reason for
each kind of refused fact (§6.2). Every row works on providers of its own and fresh tokens.
"""

from __future__ import annotations

import hashlib

import trio

from provisionerd.conformance.checks_state import join_primary_or_reply
from provisionerd.conformance.context import IDENTITY, Context
from provisionerd.conformance.peer import Peer, describe, join, join_primary, new_instance
from provisionerd.conformance.results import CheckFailed, NotRun
from provisionerd.domain.model import (
    DrainRequested,
    Epoch,
    Fact,
    HostState,
    HostStatus,
    InstanceFact,
    OrphanReported,
    RequestIntent,
    Returned,
    ReturnIntent,
    Role,
)
from provisionerd.wire.messages import (
    Ack,
    ErrorMsg,
    FactAck,
    FactCommit,
    Heartbeat,
    HeartbeatAck,
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
)

#: The longest provider name a Join may declare (protocol §4).
MAX_PROVIDER_NAME = 256
#: How long past a lease's TTL the kit renews it to see it expired (the controller's clock may lag the kit's).
EXPIRY_SLACK = 1.0


def _refused(reply: Message) -> bool:
    return isinstance(reply, JoinReply) and not reply.accepted


async def join_checks_in_order(ctx: Context) -> str:
    """§7: a Join with a bad identity is refused with ``JoinReply{accepted: false}`` before a worker's token is
    looked at (the token stays unspent); provider names are 1..256 characters."""
    said, problems = [], []
    address = (await ctx.provisioner([ctx.provider("names")]))[0].address
    for label, providers in [
        ("an empty provider name", ("",)),
        (f"a provider name of {MAX_PROVIDER_NAME + 1} characters", ("p" * (MAX_PROVIDER_NAME + 1),)),
    ]:
        peer, reply = await join(ctx.connector, address, ctx.join_msg(providers, new_instance()))
        await peer.aclose()
        if _refused(reply):
            said.append(f"{label}: JoinReply accepted=false")
        else:
            problems.append(f"a provisioner Join with {label} answered {describe(reply)}, not JoinReply accepted=false")
    longest = ctx.provider("n").ljust(MAX_PROVIDER_NAME, "x")
    peer, reply = await join(ctx.connector, address, ctx.join_msg((longest,), new_instance()))
    await peer.aclose()
    if isinstance(reply, JoinReply) and reply.accepted:
        said.append(f"a provider name of {MAX_PROVIDER_NAME} characters: accepted")
    else:
        problems.append(
            f"a Join declaring a provider name of {MAX_PROVIDER_NAME} characters answered {describe(reply)}"
        )
    if not ctx.connector.has_role(Role.WORKER):
        said.append(f"worker part NOT RUN: no worker certificate in {ctx.connector.certs_dir}")
    else:
        tokens = await ctx.worker_tokens("order", 1)
        ref, token = tokens.refs[0], tokens.tokens[0]
        made_up = "not-a-token-" + new_instance()
        for label, secret in [("a made-up token", made_up), ("a good token", token)]:
            peer, bad = await join_primary_or_reply(ctx, Join(Role.WORKER, "", instance_ref=ref, token=secret))
            await peer.aclose()
            if _refused(bad):
                said.append(f"a worker Join with an empty identity and {label}: JoinReply accepted=false")
            elif isinstance(bad, ErrorMsg):
                problems.append(
                    f"a worker Join with an empty identity and {label} answered {describe(bad)}: the secret was"
                    " judged before the identity (protocol.md §7: the identity comes first)"
                )
            else:
                problems.append(f"a worker Join with an empty identity and {label} answered {describe(bad)}")
        peer, good = await join_primary_or_reply(ctx, Join(Role.WORKER, IDENTITY, instance_ref=ref, token=token))
        await peer.aclose()
        if isinstance(good, JoinReply) and good.accepted:
            said.append("the same token then: accepted (it was not spent)")
        else:
            problems.append(f"the token after the refused bad-identity Join answered {describe(good)}: it was spent")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said)


async def lease_refusals(ctx: Context) -> str:
    """§5: a lease request for a provider the Join did not declare is ``Rejected{invalid}`` (not a
    ``LeaseDenied``) and the link stays up; a release is ``Rejected{staleEpoch}`` exactly when a live lease has
    another epoch or holder, and acked otherwise (nothing live: acked)."""
    provider, undeclared = ctx.provider("refusals"), ctx.provider("undeclared")
    peer, _ = await ctx.provisioner([provider])
    other, _ = await ctx.provisioner([provider], instance=new_instance())
    said, problems = [], []
    for msg in (LeaseAcquire(undeclared), LeaseRenew(undeclared, Epoch(1, 1)), LeaseRelease(undeclared, Epoch(1, 1))):
        reply = await peer.request(msg)
        what = f"{type(msg).__name__} of a provider not in the Join"
        if isinstance(reply, Rejected) and reply.reason == "invalid":
            said.append(f"{what}: rejected invalid")
        else:
            problems.append(f"{what} answered {describe(reply)}, not rejected invalid")
    beat = await peer.request(Heartbeat(7))
    if not isinstance(beat, HeartbeatAck):
        problems.append(f"after those refusals a heartbeat answered {describe(beat)}: the link must stay up")
    grant = await ctx.acquire(peer, provider)
    wrong = Epoch(grant.epoch.term, grant.epoch.seq + 1000)
    for label, sender, epoch in [
        ("the holder's release with another epoch", peer, wrong),
        ("another process's release of the live epoch", other, grant.epoch),
    ]:
        reply = await sender.request(LeaseRelease(provider, epoch))
        if isinstance(reply, Rejected) and reply.reason == "stale_epoch":
            said.append(f"{label}: rejected stale_epoch")
        else:
            problems.append(f"{label} answered {describe(reply)}, not rejected stale_epoch")
    still = await peer.request(LeaseRenew(provider, grant.epoch))
    if not isinstance(still, LeaseGrant):
        problems.append(f"after the refused releases the holder's renew answered {describe(still)}")
    for label in ("the holder's release", "the same release again (nothing live)"):
        reply = await peer.request(LeaseRelease(provider, grant.epoch))
        if isinstance(reply, Ack):
            said.append(f"{label}: ack")
        else:
            problems.append(f"{label} answered {describe(reply)}, not ack")
    said.append(await _renew_after_expiry(ctx, peer, provider, problems))
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said)


async def _renew_after_expiry(ctx: Context, peer: Peer, provider: str, problems: list[str]) -> str:
    """§5: a renew after the lease expired on the controller's clock is ``noLease``, even from its holder with its
    epoch (an expired lease is never revived); the acquire that follows gets a higher epoch. Waits one TTL."""
    grant = await ctx.acquire(peer, provider)
    ttl = grant.ttl_ms / 1000
    await peer.keep_alive(ttl + EXPIRY_SLACK)
    late = await peer.request(LeaseRenew(provider, grant.epoch))
    if not (isinstance(late, LeaseDenied) and late.reason == "no_lease"):
        problems.append(
            f"the holder's renew {ttl + EXPIRY_SLACK:g}s after a grant of {ttl:g}s answered {describe(late)}"
        )
        if isinstance(late, LeaseGrant):
            await peer.request(LeaseRelease(provider, late.epoch))
        return "renew after expiry: not no_lease"
    again = await ctx.acquire(peer, provider)
    await peer.request(LeaseRelease(provider, again.epoch))
    if not again.epoch > grant.epoch:
        problems.append(f"the acquire after the expiry got {again.epoch}, not above the expired {grant.epoch}")
    return f"renew {ttl + EXPIRY_SLACK:g}s after a {ttl:g}s grant: denied no_lease; re-acquired as {again.epoch}"


def _malformed(provider: str, epoch: Epoch, op: str) -> list[tuple[str, Fact]]:
    good = "0" * 64
    return [
        ("count 2 with one instance ref", RequestIntent(provider, epoch, op, "t", 2, ("r",), (good,))),
        ("a token hash that is not hex SHA-256", RequestIntent(provider, epoch, op, "t", 1, ("r",), ("AB" * 32,))),
        ("two equal instance refs", RequestIntent(provider, epoch, op, "t", 2, ("r", "r"), (good, good))),
        ("an instance fact with an empty machine id", InstanceFact(provider, epoch, op, "r", "", "t", good)),
        ("a return of no machine", ReturnIntent(provider, epoch, op, (), "kit")),
        ("a drain of no machine", DrainRequested(provider, epoch, op, (), "kit", 0.0)),
        ("an unknown orphan class", OrphanReported(provider, epoch, op, "m", "weird", "{}")),
        ("orphan evidence that is not JSON", OrphanReported(provider, epoch, op, "m", "ghost", "{not json")),
        ("an empty op id", RequestIntent(provider, epoch, "", "t", 1, ("r",), (good,))),
        ("epoch (0, 0)", RequestIntent(provider, Epoch(0, 0), op, "t", 1, ("r",), (good,))),
    ]


async def fact_refusals(ctx: Context) -> str:
    """§6.2: each malformed fact is ``Rejected{invalid}`` even under the live epoch; another process's fact under
    the holder's epoch is ``noLease``; with no lease live, a fact under the provider's latest epoch is ``noLease``
    and one under an older epoch ``staleEpoch``; the same fact again is acked with its index whatever the lease
    (the duplicate is checked before the epoch)."""
    provider = ctx.provider("facts")
    peer, _ = await ctx.provisioner([provider])
    other, _ = await ctx.provisioner([provider], instance=new_instance())
    said, problems = [], []
    first = await ctx.acquire(peer, provider)
    old_fact, _ = ctx.intent(provider, first.epoch)
    await ctx.commit(peer, old_fact)
    await peer.request(LeaseRelease(provider, first.epoch))
    grant = await ctx.acquire(peer, provider)
    invalid = 0
    for label, fact in _malformed(provider, grant.epoch, ctx.op_id()):
        reply = await peer.request(FactCommit(fact))
        if isinstance(reply, Rejected) and reply.reason == "invalid":
            invalid += 1
        else:
            problems.append(f"a fact with {label} answered {describe(reply)}, not rejected invalid")
            if isinstance(reply, FactAck) and isinstance(fact, RequestIntent):
                ctx.intents.append((provider, fact.op_id))
    said.append(f"{invalid} malformed facts rejected invalid")
    foreign, _ = ctx.intent(provider, grant.epoch)
    reply = await other.request(FactCommit(foreign))
    if isinstance(reply, Rejected) and reply.reason == "no_lease":
        said.append("another process's fact under the holder's epoch: rejected no_lease")
    else:
        problems.append(f"another process's fact under the holder's epoch answered {describe(reply)}, not no_lease")
        if isinstance(reply, FactAck):
            ctx.intents.append((provider, foreign.op_id))
    latest, _ = ctx.intent(provider, grant.epoch)
    index = await ctx.commit(peer, latest)
    await peer.request(LeaseRelease(provider, grant.epoch))
    for label, epoch, reason in [
        ("the latest epoch", grant.epoch, "no_lease"),
        ("an older epoch", first.epoch, "stale_epoch"),
    ]:
        fact, _ = ctx.intent(provider, epoch)
        reply = await peer.request(FactCommit(fact))
        if isinstance(reply, Rejected) and reply.reason == reason:
            said.append(f"no lease live, a fact under {label}: rejected {reason}")
        else:
            problems.append(
                f"with no lease live, a fact under {label} {epoch} answered {describe(reply)}, not {reason}"
            )
            if isinstance(reply, FactAck):
                ctx.intents.append((provider, fact.op_id))
    again = await peer.request(FactCommit(latest))
    if isinstance(again, FactAck) and again.index == index:
        said.append(f"the same fact again with no lease live: acked with its index {index}")
    else:
        problems.append(f"the same fact again (no lease live) answered {describe(again)}, not its index {index}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said)


async def _host_push(peer: Peer, ref: str, timeout: float) -> tuple[HostState, int]:
    """The next pushed state of host ``ref`` and the push's ``seq``."""
    deadline = trio.current_time() + timeout
    while True:
        push = await peer.wait_push(HostStatePush, max(0.0, deadline - trio.current_time()))
        assert isinstance(push, HostStatePush)
        mine = [h for h in push.hosts if h.instance_ref == ref]
        if mine:
            return mine[-1], push.seq


async def _resync_hosts(peer: Peer, provider: str) -> tuple[int, list[HostState]]:
    """One whole resync of ``provider``: how many pages, and the hosts they carry."""
    corr = await peer.send(ResyncRequest((provider,)))
    pages: list[ResyncPage] = []
    while not pages or len(pages) < pages[0].page_count:
        page = await peer.reply_to(corr, "ResyncRequest")
        if not isinstance(page, ResyncPage):
            raise CheckFailed(f"ResyncRequest answered {describe(page)}")
        pages.append(page)
    return len(pages), [host for page in pages for host in page.hosts]


async def hosts_before_instance_fact(ctx: Context) -> str:
    """§6.4: a worker that joins on its intent's token before its ``instanceFact`` is pushed at once with an empty
    ``machineId``, then again with it filled when the fact lands; §6.3: the heartbeat digest's ``hostSeq`` counts
    those changes (a worker's digest is all 0), a second resync on one connection is answered like the first, and a
    host whose machine's lifecycle ended is missing from the next resync (no push removes it)."""
    if not ctx.connector.has_role(Role.WORKER):
        raise NotRun(f"no worker certificate in {ctx.connector.certs_dir}")
    tokens = await ctx.worker_tokens("early", 1)
    provider, ref = tokens.provider, tokens.refs[0]
    holder, _ = await ctx.provisioner([provider])
    first_pages, _ = await _resync_hosts(holder, provider)  # after the join, as a daemon does
    grant = await ctx.acquire(holder, provider)
    said, problems = [f"resync after the join: {first_pages} page(s)"], []
    worker, _ = await join_primary(
        ctx.connector, ctx.addresses, Join(Role.WORKER, IDENTITY, instance_ref=ref, token=tokens.tokens[0])
    )
    ctx.peers.append(worker)
    beat = await worker.request(Heartbeat(1))
    if isinstance(beat, HeartbeatAck) and (beat.last_index, beat.demand_seq, beat.host_seq) == (0, 0, 0):
        said.append("a worker's heartbeat digest: 0, 0, 0")
    else:
        problems.append(f"a worker's heartbeat answered {describe(beat)}, not a digest of 0, 0, 0")
    early, seq1 = await _host_push(holder, ref, ctx.options.timeout)
    if early.machine_id or early.status is not HostStatus.JOINED:
        problems.append(f"the host of a worker joined before its instance fact was pushed as {early}")
    machine = f"{tokens.op_id}-machine"
    token_hash = hashlib.sha256(tokens.tokens[0].encode()).hexdigest()
    fact = InstanceFact(provider, grant.epoch, tokens.op_id, ref, machine, "kit-template", token_hash, "kit-host")
    await ctx.commit(holder, fact)
    named, seq2 = await _host_push(holder, ref, ctx.options.timeout)
    if named.machine_id != machine or named.hostname != "kit-host" or named.status is not HostStatus.JOINED:
        problems.append(f"after its instance fact the host was pushed as {named}, not with machineId {machine!r}")
    said.append(
        f"pushed joined with machineId '' (seq {seq1}), then with {machine!r} once the fact landed (seq {seq2})"
    )
    digest = await holder.request(Heartbeat(2))
    if not (isinstance(digest, HeartbeatAck) and digest.host_seq == seq2 == seq1 + 1):
        problems.append(
            f"two host changes pushed as seq {seq1} then {seq2}, and the digest answered {describe(digest)}: hostSeq"
            " counts the changes queued for the connection, and equals the last push's seq"
        )
    back = f"{tokens.op_id}-back"
    await ctx.commit_many(
        holder,
        [
            ReturnIntent(provider, grant.epoch, back, (machine,), "kit"),
            Returned(provider, grant.epoch, back, (machine,)),
        ],
    )
    pages, hosts = await _resync_hosts(holder, provider)
    await holder.request(LeaseRelease(provider, grant.epoch))
    if any(h.instance_ref == ref for h in hosts):
        problems.append(f"a resync after the machine {machine!r} was returned still carries its host")
    else:
        said.append(f"once returned, its host is missing from the next resync ({pages} page(s), {len(hosts)} hosts)")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "; ".join(said)
