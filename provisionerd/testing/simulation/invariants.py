"""The invariants a simulated run must keep (DESIGN.md "Invariants"), as checks over the recorder's observations.

Continuous checks run as each observation is recorded (``check_*``); ``final_checks`` runs once at the end. Each
violation names its invariant with a stable word (the ``simulate`` command prints it):

``mutation_without_lease``   a provider mutation started while its caller's lease was not valid by the caller's
                             own local deadline (invariant 1)
``mutation_without_intent``  a provider mutation started without an intent for its op_id committed on the
                             controller under the epoch the caller held (invariant 1)
``gate_decision``            the gate admitted a mutation it should not have (``gate.violations``)
``stale_fact_accepted``      the controller appended a fact whose epoch is not the provider's live lease epoch, or
                             from a sender that is not the lease's holder (invariant 7)
``epoch_regressed``          a newly granted epoch, a fact in the log, or a daemon's held epochs went backwards
``two_lease_holders``        lease safety: two daemon instances trusted the provider's lease at the same instant,
                             or an older epoch was still trusted when a newer one was granted
``op_created_twice``         machines were created for one op_id by more than one call, or more than it asked for
                             (invariant 2)
``unexplained_machine``      a machine the provider runs that no committed intent (or orphan finding) explains
                             (invariant 3)
``daemon_crashed``           a daemon task died of an exception (anything but cancellation is a bug)
``controller_error``         the reference controller counted an internal error
``mutation_while_halted``    a daemon that remembers a controller incarnation that was lost (``store_loss``) started
                             a provider mutation before the admin accepted the reset (invariant 9)
``machine_forgotten``        a machine running when the controller lost its store was gone when the admin accepted
                             the reset, and no vanish fault took it (invariant 9: keep every machine)
``reload_raised``            a config reload, or the guarded admin command, raised out (``reload`` fault)
``admin_unanswered``         an admin orphan action got no answer, or one neither ok nor a typed refusal
                             (``internal_error`` is the daemon's own bug report)
``reload_half_applied``      a reload that needs a restart changed the running config, policy or orphan policy
``reload_not_live``          a live reload was not in force at once, or the reloaded daemon made a new request beyond
                             the new ``max_machines`` (machines already above a lowered cap are no violation)
``stuck``                    the run made no virtual progress (a busy loop) within its wall-clock budget
``no_convergence``           with the lifecycle: machines did not match demand within the settle time after faults
``failed_with_machines``     an op was failed (``RequestFailed``) while a machine it made runs with no instance fact
                             (issue 31: after a foreign requestId, a restart mid-call, a deadline, the machines an op
                             made are explained before the rest becomes a new op)
``joined_retired_as_never_joined``  a machine whose worker had joined was returned as ``never_joined`` (invariant
                             11: a restart costs no machine; a controller restart empties its host table)
``notice_ignored``           a machine with a spot interruption notice was still unreturned when the cloud took it
                             back, though no fault touched the notice's span and a daemon ran throughout (issue 34:
                             an idle noticed machine is returned at once and replaced in the same plan)
``partial_gang_kept``        an all-or-nothing request the cloud answered in part still had a machine running at the
                             end (issue 35 item 5: what such an op made is returned whole, after any restart)

Why the lease check has two parts: at any instant at most one instance may trust the lease (checked whenever a
belief starts or is extended); and across epochs the older holder's trust must have ended no later than the
controller granted the newer epoch (checked at the end, once every belief's end is known). The second is what makes
the first hold under any message delay: a holder counts its deadline from when it *sent* the renewal, the
controller from when it *received* it, and a new primary waits ``ttl + check_interval`` before granting to anyone
else.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from provisionerd.domain.model import TAG_INSTANCE, TAG_OP, InstanceFact, RequestIntent, Returned, ReturnIntent
from provisionerd.planner.fact_view import fold

if TYPE_CHECKING:
    from provisionerd.domain.model import CommittedFact, Epoch
    from provisionerd.testing.simulation.observe import Belief, Commit, Creation, Mutation, Recorder

INVARIANTS = (
    "mutation_without_lease",
    "mutation_without_intent",
    "gate_decision",
    "stale_fact_accepted",
    "epoch_regressed",
    "two_lease_holders",
    "op_created_twice",
    "unexplained_machine",
    "daemon_crashed",
    "controller_error",
    "mutation_while_halted",
    "machine_forgotten",
    "reload_raised",
    "admin_unanswered",
    "reload_half_applied",
    "reload_not_live",
    "stuck",
    "no_convergence",
    "joined_retired_as_never_joined",
    "failed_with_machines",
    "notice_ignored",
    "partial_gang_kept",
)

#: The intent kind a mutating provider action needs.
INTENT_FOR = {
    "requestMachines": RequestIntent.__name__,
    "requestReturnMachines": ReturnIntent.__name__,
    "stopMachines": ReturnIntent.__name__,
}
MUTATING = frozenset(INTENT_FOR)


def check_new_epoch(rec: Recorder, provider: str, epoch: object) -> None:
    last = rec.last_new_epoch.get(provider)
    if last is not None and not epoch > last:  # type: ignore[operator]
        rec.violate("epoch_regressed", f"{provider}: the controller granted new epoch {epoch} after {last}")


def check_commit(rec: Recorder, commit: Commit) -> None:
    if commit.lease_epoch != commit.epoch or commit.lease_holder != commit.sender:
        rec.violate(
            "stale_fact_accepted",
            f"{commit.kind} {commit.op_id} (index {commit.index}) with epoch {commit.epoch} from {commit.sender} "
            f"accepted while the live lease was {commit.lease_epoch} held by {commit.lease_holder}",
        )
    previous = rec.last_fact.get(commit.provider)
    if previous is not None and commit.epoch < previous.epoch:
        rec.violate(
            "epoch_regressed",
            f"{commit.provider}: fact {commit.index} has epoch {commit.epoch} after "
            f"fact {previous.index} with {previous.epoch}",
        )
    rec.last_fact[commit.provider] = commit
    check_unknown_ops(rec, commit)


def check_unknown_ops(rec: Recorder, commit: Commit) -> None:
    """``failed_with_machines``: an op is failed only once every machine it made that still runs has its instance
    fact (a listing by op tag explains them before the rest becomes a new op): after a foreign requestId, after a
    restart (the recovery), at the provisioning deadline (the fail waits until a listing of the op succeeds)."""
    if commit.kind != "RequestFailed":
        return
    if commit.op_id in rec.lost_legacy_answers:
        # A legacy plugin call of this op acted and its answer was lost: if its request is not told apart from
        # another lost call's, the op fails and is never retried, by design (docs/providers.md); what it made must
        # then be named by the orphan report from the plugin's own record, which the final check
        # (``check_legacy_machines_explained``) verifies.
        return
    foreign = commit.op_id in rec.unknown_ops
    rec.unknown_ops.discard(commit.op_id)
    explained = {c.fact.instance_ref for c in rec.commits_by_op.get(("InstanceFact", commit.op_id), [])}
    made = [
        (machine, ref)
        for creation in rec.creations.get(commit.op_id, [])
        for machine, ref in zip(creation.machine_ids, creation.instance_refs, strict=True)
        if machine not in rec.gone
    ]
    unexplained = sorted(machine for machine, ref in made if ref not in explained)
    if unexplained:
        why = ", answered with a requestId the cloud never made," if foreign else ""
        rec.violate(
            "failed_with_machines", f"{commit.op_id}{why} failed while {unexplained} it made run with no instance fact"
        )


def check_single_holder(rec: Recorder, belief: Belief) -> None:
    now = _now()
    for other in rec.open_beliefs.values():
        if other is belief or other.provider != belief.provider or other.instance == belief.instance:
            continue
        if now < other.end and now < belief.end:
            rec.violate(
                "two_lease_holders",
                f"{belief.provider}: {belief.instance} trusts {belief.epoch} until "
                f"{belief.end:.3f} while {other.instance} trusts {other.epoch} until "
                f"{other.end:.3f}",
            )


def acked_before_loss(rec: Recorder, m: Mutation) -> bool:
    """Whether an amnesiac caller's mutation rides an intent the old controller acknowledged before the loss, and the
    caller has not learned of the loss yet. Its ack was in flight when the store went (seed 77138038: a
    ``ReturnIntent`` acked at 33.97, the store lost at 34.562, the ack delivered 0.635 s later): the daemon held a
    valid lease and an acknowledged intent and had no way to know. Every other intent needs an ack from the new
    incarnation, and that ack is how the daemon learns."""
    c = m.caller
    since = rec.amnesiac[c.instance]
    if c.instance in rec.learned:
        return False
    commits = rec.commits_by_op.get((INTENT_FOR[m.action], m.op_id), [])
    return any(x.epoch == c.epoch and x.provider == m.provider and x.at <= since for x in commits)


def check_mutation(rec: Recorder, m: Mutation) -> None:
    c = m.caller
    if c.instance in rec.amnesiac and not acked_before_loss(rec, m):
        rec.violate(
            "mutation_while_halted",
            f"{m.action} {m.op_id} by {c.instance}, which remembers a lost controller incarnation, before the admin"
            " accepted the reset",
        )
    if not c.valid:
        rec.violate(
            "mutation_without_lease",
            f"{m.action} {m.op_id} by {c.instance}: lease epoch {c.epoch} "
            f"trusted until {c.valid_until:.3f}, now {m.at:.3f}",
        )
        return
    kind = INTENT_FOR[m.action]
    commits = rec.commits_by_op.get((kind, m.op_id), [])
    if not any(x.epoch == c.epoch and x.provider == m.provider and x.at <= m.at for x in commits):
        found = ", ".join(str(x.epoch) for x in commits) or "none"
        rec.violate(
            "mutation_without_intent",
            f"{m.action} {m.op_id} by {c.instance} under {c.epoch}: committed {kind} epochs: {found}",
        )


def check_creation(rec: Recorder, creation: Creation) -> None:
    """No instance reference of an op is made twice, and an op makes no more machines than its intent counts (a
    legacy op with per-machine userData makes its machines one call each: several creations, distinct refs)."""
    made = rec.creations[creation.op_id]
    refs = [r for c in made for r in c.instance_refs]
    if len(refs) != len(set(refs)):
        rec.violate(
            "op_created_twice",
            f"op {creation.op_id} created machines {len(made)} times: "
            + "; ".join(f"{list(c.machine_ids)} by {c.caller}" for c in made),
        )
        return
    total = sum(len(c.machine_ids) for c in made)
    intents = [c.fact for c in rec.commits_by_op.get((RequestIntent.__name__, creation.op_id), [])]
    if intents and total > max(i.count for i in intents):
        rec.violate(
            "op_created_twice",
            f"op {creation.op_id} created {total} machines for an intent of {max(i.count for i in intents)}",
        )


# --- the reload fault (``reload_fault``) ---------------------------------------------------------------------------

#: The typed refusals an admin request may get (``daemon.admin_guard``); ``internal_error`` is not among them.
ADMIN_REFUSALS = frozenset({"bad_request", "unknown_provider", "busy", "not_ready"})


def check_admin_answer(rec: Recorder, instance: str, request: dict[str, object], answer: object) -> None:
    if isinstance(answer, dict) and isinstance(answer.get("ok"), bool):
        decided = isinstance(answer.get("result"), dict)  # a decision: done, would do, or refused with a reason
        if decided or answer.get("pending") is True or answer.get("refused") in ADMIN_REFUSALS:
            return
    rec.violate(
        "admin_unanswered",
        f"{instance}: orphan_action {request.get('action')} {request.get('machine')} answered {answer!r:.200}",
    )


def check_restart_reload(rec: Recorder, instance: str, outcome: str, *, unchanged: bool) -> None:
    if outcome != "restart_needed" or not unchanged:
        rec.violate(
            "reload_half_applied",
            f"{instance}: a reload that needs a restart was {outcome}; running config unchanged: {unchanged}",
        )


def check_live_reload(rec: Recorder, instance: str, outcome: str, *, installed: bool) -> None:
    if outcome != "applied" or not installed:
        rec.violate("reload_not_live", f"{instance}: a live reload was {outcome}; new config in force: {installed}")


def check_request_within_cap(
    rec: Recorder, m: Mutation, cap: int, facts: Iterable[CommittedFact], provider: str
) -> None:
    """A request planned after a live reload lowered the cap: the machines live in the controller's log (a lower
    bound of what the planner counts) plus this request's count must fit in ``cap``."""
    intents = [c.fact for c in rec.commits_by_op.get((RequestIntent.__name__, m.op_id), []) if c.provider == provider]
    count = max((i.count for i in intents), default=0)
    view = fold(facts)
    live = sum(n for (p, _), n in view.live_by_offer.items() if p == provider)
    if live + count > cap:
        rec.violate(
            "reload_not_live",
            f"{m.op_id} by {m.caller.instance}: {count} machine(s) requested with {live} live after a reload set "
            f"max_machines = {cap}",
        )


# --- at the end ----------------------------------------------------------------------------------------------------


def check_lease_history(rec: Recorder) -> None:
    """The pairwise lease rule over every belief of the run (see the module docstring), one controller era at a
    time (a store loss starts the epochs again; across eras ``check_single_holder`` checked every instant). A
    belief is filed under the era whose controller granted its epoch, even when the grant arrived after the loss
    (``Recorder.hold``)."""
    for grants, beliefs in [*rec.past_eras, (rec.grants, rec.beliefs)]:
        _check_era(rec, grants, beliefs)


def _check_era(rec: Recorder, grants: dict[tuple[str, Epoch], float], all_beliefs: list[Belief]) -> None:
    by_provider: dict[str, list[Belief]] = {}
    for belief in all_beliefs:
        by_provider.setdefault(belief.provider, []).append(belief)
    for provider, beliefs in by_provider.items():
        for a, b in itertools.combinations(beliefs, 2):
            if a.epoch == b.epoch:
                if a.instance != b.instance and a.start < b.end and b.start < a.end:
                    rec.violate(
                        "two_lease_holders",
                        f"{provider}: {a.instance} and {b.instance} both trusted "
                        f"{a.epoch} in [{max(a.start, b.start):.3f}, "
                        f"{min(a.end, b.end):.3f})",
                    )
                continue
            old, new = (a, b) if a.epoch < b.epoch else (b, a)
            granted = grants.get((provider, new.epoch))
            if granted is not None and old.end > granted:
                rec.violate(
                    "two_lease_holders",
                    f"{provider}: {old.instance} trusted {old.epoch} until "
                    f"{old.end:.3f}, after {new.epoch} was granted at {granted:.3f}",
                )
    per_instance: dict[tuple[str, str], list[Belief]] = {}
    for belief in all_beliefs:
        per_instance.setdefault((belief.instance, belief.provider), []).append(belief)
    for (instance, provider), beliefs in per_instance.items():
        for a, b in itertools.pairwise(beliefs):
            if b.epoch < a.epoch:
                rec.violate("epoch_regressed", f"{instance} held {provider} epoch {b.epoch} after {a.epoch}")


def check_machines_explained(
    rec: Recorder, provider: str, machines: Iterable[dict[str, object]], reported: set[str]
) -> None:
    """Every live machine carries an op tag whose committed request intent lists its instance_ref, or has been
    reported as an orphan (``reported``: machine ids of committed orphan findings)."""
    for machine in machines:
        machine_id = str(machine["machineId"])
        if machine_id in reported:
            continue
        tags = machine.get("tags") or {}
        assert isinstance(tags, dict)
        op_id, ref = tags.get(TAG_OP, ""), tags.get(TAG_INSTANCE, "")
        intents = [c.fact for c in rec.commits_by_op.get((RequestIntent.__name__, op_id), []) if c.provider == provider]
        if not any(ref in i.instance_refs for i in intents):
            rec.violate(
                "unexplained_machine",
                f"{provider}: machine {machine_id} (op {op_id!r}, instance "
                f"{ref!r}) is explained by no committed intent or orphan finding",
            )


def check_legacy_machines_explained(
    rec: Recorder, provider: str, machines: Iterable[dict[str, object]], reported: set[str]
) -> None:
    """A legacy plugin's machines carry no tags and cannot be listed: each live one is named by a committed
    ``InstanceFact`` no ``Returned`` fact followed, or reported (``reported``: machine ids of committed orphan
    findings, and those the daemon's orphan report names from the plugin's own record)."""
    facts: dict[str, str] = {}
    for commit in rec.commits:
        if commit.provider != provider:
            continue
        if isinstance(commit.fact, InstanceFact):
            facts[commit.fact.machine_id] = "instance"
        elif isinstance(commit.fact, Returned):
            for machine_id in commit.fact.machine_ids:
                facts[machine_id] = "returned"
    for machine in machines:
        machine_id = str(machine["machineId"])
        if machine_id in reported or facts.get(machine_id) == "instance":
            continue
        why = "returned by a fact" if facts.get(machine_id) == "returned" else "named by no instance fact"
        rec.violate(
            "unexplained_machine",
            f"{provider}: legacy machine {machine_id} (instance {machine.get('instanceRef', '')!r}) runs, {why}, "
            "and no orphan finding or report names it",
        )


def _now() -> float:
    import trio

    return trio.current_time()


def check_joined_never_retired_as_never_joined(rec: Recorder, joined: set[str], refs: dict[str, str]) -> None:
    """No ``ReturnIntent`` with reason ``never_joined`` names a machine whose worker joined (``joined``: instance
    refs; ``refs``: machine_id -> instance_ref as the cloud made them)."""
    for commit in rec.commits:
        fact = commit.fact
        if not isinstance(fact, ReturnIntent) or fact.reason != "never_joined":
            continue
        for machine_id in fact.machine_ids:
            if refs.get(machine_id) in joined:
                rec.violate(
                    "joined_retired_as_never_joined",
                    f"{machine_id} ({refs[machine_id]}) returned as never_joined by {commit.sender} (index "
                    f"{commit.index}) although its worker had joined",
                )
