"""``provisionerd orphans adopt|return --config FILE --provider P --machine ID``: act on one finding explicitly.

The command joins the controller as its own identity (``<identity>-orphans-admin``), **acquires the provider's
lease itself** and passes the same mutation gate and executor as the daemon. So the running daemon must not hold
that provider's lease: while it does, the controller refuses ours (``held``) and the command exits 1 having
changed nothing. Stop the daemon (or wait for it to give the lease up) first; the lease is released on exit.
(Routing the command through the running daemon's admin socket would avoid that; it is not built yet.)

What the admin's word overrides, and what it does not
------------------------------------------------------
It reads both views and classifies like an orphan pass, with the lease held, then looks up the finding for
``--machine``. The admin *is* the confirmation, so policy blockers are overridden: ``grace``,
``launch_time_unknown``, ``already_reported``, ``rate_cap``, ``breaker_open``, ``dry_run``, ``settling`` (this
command's own link just joined). Never overridden: an unreadable view, no lease, a controller that is not the
primary, the protect tag, and a machine that is not a finding at all (untagged or another cluster's, tracked, or
not listed). ``adopt`` needs a ``tagged_unknown`` finding (a live host match is used when there is exactly one);
``return`` needs a ``never_joined`` or ``tagged_unknown`` finding that matches no live host (returning a machine a
worker runs on is a drain, not an orphan cleanup). The action is audited as ``orphan_action`` with
``confirmed_by: {"by": "admin", "user": ..., "identity": ...}`` in the daemon's events log.
"""

from __future__ import annotations

import argparse
import getpass
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from provisionerd.config import Config
from provisionerd.controller_ops import ControllerOps
from provisionerd.errors import ConfigError, ProvisionerdError
from provisionerd.events import EventLog
from provisionerd.executor import Executor, ExecutorSettings
from provisionerd.gate import MutationGate
from provisionerd.lease import LeaseKeeper
from provisionerd.model import OrphanAdopted
from provisionerd.orphan_cycle import return_outcome
from provisionerd.orphan_daemon import policy_of
from provisionerd.orphan_model import (
    AMBIGUOUS_MATCH,
    LISTING_ABSENT,
    LISTING_UNREADABLE,
    NEVER_JOINED,
    NO_LEASE,
    NOT_PRIMARY,
    PROTECTED,
    TAGGED_UNKNOWN,
    VIEW_UNREADABLE,
    Finding,
    Listing,
    orphan_op_id,
    thaw,
)
from provisionerd.orphan_reads import SettleTracker, read_keeper, read_listing, read_session
from provisionerd.orphans import Observation, classify
from provisionerd.provider.runtime import ProviderClient
from provisionerd.session import ControllerSession, SessionSettings, StreamFactory

PROG = "provisionerd orphans"
#: Blockers the admin's explicit word never overrides.
HARD_BLOCKERS = frozenset({LISTING_UNREADABLE, LISTING_ABSENT, VIEW_UNREADABLE, NO_LEASE, NOT_PRIMARY, PROTECTED})


@attrs.frozen
class AdminResult:
    ok: bool
    message: str
    answer: Any = None


def check(kind: str, finding: Finding | None, machine_id: str, protect_tag: str) -> str | None:
    """Why ``kind`` may not be done to ``finding`` (``None`` when it may).

    Protection is read from the machine's tags, not from ``blocked_by``: the finding's own action may be one the
    protect tag does not stop (``report``), while the admin asks for one it does."""
    if finding is None:
        return (f"machine {machine_id!r} is not an orphan finding: it is not listed with this cluster's and this "
                "provider's tags, or a live fact explains it")  # fmt: skip
    blockers = set(finding.blocked_by)
    tags = finding.evidence.get("tags") or {}
    if protect_tag in tags:
        blockers.add(PROTECTED)
    hard = sorted(HARD_BLOCKERS.intersection(blockers))
    if hard:
        return f"blocked by {', '.join(hard)}"
    if kind == "adopt":
        if finding.orphan_class != TAGGED_UNKNOWN:
            return f"only a tagged_unknown machine can be adopted; this is {finding.orphan_class}"
        if AMBIGUOUS_MATCH in finding.blocked_by:
            return "several live hosts match it: adopting one would be a guess"
    elif finding.orphan_class not in (NEVER_JOINED, TAGGED_UNKNOWN):
        return f"only a never_joined or tagged_unknown machine can be returned; this is {finding.orphan_class}"
    elif finding.action == "adopt":
        return "it matches a live host: adopt it, or drain the host, instead of returning it"
    return None


async def act(
    config: Config,
    kind: str,
    provider: str,
    machine_id: str,
    *,
    client: ProviderClient,
    connect: StreamFactory,
    timeout: float = 30.0,
    events: EventLog | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> AdminResult:
    """Adopt or return one machine (see the module docstring). Never raises for a refusal: see ``ok``."""
    from provisionerd.orphans_cli import side_identity

    events = events if events is not None else EventLog()
    identity = side_identity(config.identity, "admin")
    settings = attrs.evolve(SessionSettings.from_config(config), identity=identity, providers=(provider,))
    session = ControllerSession(settings, connect, events, random.Random())
    ops = ControllerOps(session)
    keeper = LeaseKeeper(provider, ops, margin=config.lease.margin, backoff=config.controller.backoff,
                         rng=random.Random(), events=events)  # fmt: skip
    gate = MutationGate({provider: keeper}, ops, events)
    executor = Executor(ExecutorSettings(config.cluster, config.controller.addresses), {provider: client}, gate,
                        {provider: keeper}, ops, events,
                        facts=lambda: None if session.view is None else session.view.facts)  # fmt: skip
    listing = await read_listing(client, config.cluster, timeout=config.provider(provider).timeouts.for_action(
        "listMachines"))  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        keeper_scope = trio.CancelScope()

        async def keep() -> None:
            with keeper_scope:
                await keeper.run()

        nursery.start_soon(keep)
        try:
            with trio.move_on_after(timeout):
                await keeper.wait_valid()
            if not keeper.valid():
                return AdminResult(False, f"could not get the lease for {provider!r} ({keeper.reason}); is the "
                                          "daemon running for it? (see --help)")  # fmt: skip
            result = await _act_held(config, kind, provider, machine_id, listing, session, keeper, executor, events,
                                     identity, wall_clock)  # fmt: skip
        finally:
            keeper_scope.cancel()
            with trio.CancelScope(shield=True):
                await keeper.release(timeout=3.0)
            nursery.cancel_scope.cancel()
    return result


async def _act_held(
    config: Config,
    kind: str,
    provider: str,
    machine_id: str,
    listing: Listing,
    session: ControllerSession,
    keeper: LeaseKeeper,
    executor: Executor,
    events: EventLog,
    identity: str,
    wall_clock: Callable[[], float],
) -> AdminResult:
    controller = read_session(session, SettleTracker(0.0))
    obs = Observation(cluster_id=config.cluster, provider=provider, now=wall_clock(), listing=listing,
                      view=controller.view, hosts=controller.hosts, lease=read_keeper(keeper),
                      controller=controller.controller)  # fmt: skip
    policy = policy_of(config.provider(provider))
    result = classify(obs, policy)
    finding = next((f for f in result.findings if f.machine_id == machine_id and f.orphan_class != "license"), None)
    refusal = check(kind, finding, machine_id, policy.protect_tag)
    if refusal is not None:
        return AdminResult(False, refusal)
    assert finding is not None and obs.lease.epoch is not None
    op_id = orphan_op_id(provider, finding.orphan_class, machine_id, kind)
    try:
        if kind == "adopt":
            host = finding.evidence.get("matching_host") or {}
            fact = OrphanAdopted(provider, obs.lease.epoch, op_id, machine_id,
                                 host.get("instance_ref") or finding.evidence.get("instance_ref") or machine_id,
                                 host.get("hostname") or finding.evidence.get("name") or "",
                                 host.get("address") or finding.evidence.get("address") or "")  # fmt: skip
            answer: Any = {"fact_index": await executor.commit_fact(fact)}
            outcome = "ok"
        else:
            returned = await executor.return_machines(provider, op_id, (machine_id,),
                                                      f"admin: orphan {finding.orphan_class}: return")  # fmt: skip
            answer = json.loads(json.dumps(attrs.asdict(returned), default=str))
            outcome = return_outcome(returned)
    except ProvisionerdError as exc:
        answer, outcome = {"error": type(exc).__name__, "detail": str(exc)}, "refused"
    events.emit("orphan_action", provider=provider, orphan_class=finding.orphan_class, machine_id=machine_id,
                action=kind, op_id=op_id, epoch=obs.lease.epoch, evidence=thaw(finding.evidence),
                confirmed_by={"by": "admin", "user": _user(), "identity": identity,
                              "overridden": list(finding.blocked_by)},
                outcome=outcome, answer=answer)  # fmt: skip
    return AdminResult(outcome == "ok", f"{kind} {machine_id}: {outcome}", answer)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def main(argv: list[str]) -> int:
    from provisionerd.orphans_cli import load_config, open_clients, print_config_error

    parser = argparse.ArgumentParser(prog=f"{PROG} adopt|return", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("kind", choices=("adopt", "return"))
    parser.add_argument("--config", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        config = load_config(args.config, [args.provider])
        from provisionerd.connect import tls_connector

        connect = tls_connector(config)
    except ConfigError as exc:
        print_config_error(exc)
        return 2

    async def run() -> AdminResult:
        async with open_clients(config, [args.provider]) as clients:
            return await act(config, args.kind, args.provider, args.machine, client=clients[args.provider],
                             connect=connect, timeout=args.timeout, events=EventLog(config.daemon.events_log))
    result = trio.run(run)
    print(f"{PROG} {args.kind}: {result.message}", file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


__all__ = ["AdminResult", "act", "check", "main"]
