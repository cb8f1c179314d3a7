"""The orphan cycle: one classification pass per provider per interval, and the allowed actions carried out.

A pass (``OrphanCycle.run_pass``):

1. reads the provider's ``listMachines`` (or notes it ``Unreadable``; a provider that has no listing at all, a
   legacy LSF plugin, is ``ListingAbsent``: not called, every action blocked by ``listing_absent``, and each
   ``orphan_pass`` event says ``listing: "absent"``, the ``invisible`` classes and the adapter's
   ``unknown_outcomes``), *then* the controller's view, hosts and the lease (``provisionerd.execution.orphan_reads``,
   through the provider's typed read-only client, ``provisionerd.provider.client.ProviderReader``), and between the
   listing and the view the licence grants of a plugin that declares pools (``orphan_licences``: class d);
2. classifies them (``provisionerd.orphans.classify``, pure) with the memory of the previous pass;
3. writes the audit: ``orphan_pass`` (counts, breaker, skipped views), ``orphan_detected`` for every finding that
   is new or whose action or blockers changed since the last pass (with its evidence), ``orphan_resolved`` for a
   finding that is gone;
4. carries out each allowed action through the executor (never around it): ``return``/``stop``/``terminate`` by
   ``executor.return_machines`` (which gates a ``ReturnIntent``, calls the provider, polls, commits
   ``Returned``); ``adopt``/``retire``/``report`` by committing ``PlannedAction.fact()`` with
   ``executor.commit_fact``. Each one is audited as ``orphan_action``: evidence, action, op_id, epoch, what
   confirmed it, the outcome and the provider's (or controller's) answer;
5. keeps the memory: ghost counts from the classifier, and each cleanup's answer (``after_cleanup``).

The admin's explicit action (``provisionerd orphans adopt|return``, ``provisionerd.daemon.orphan_admin``) uses the
same steps: ``observe`` (1), ``carry_out`` (4) and ``audit_action``, with ``confirmed_by`` naming the admin.

Invariant 5: a pass that could not read both views acts on nothing (the classifier allows nothing then; this module
checks again before acting). A gate refusal (lease lapsed, link down, controller rejected) ends the pass's actions:
the next ones would be refused the same way. A provider failure counts towards the circuit breaker; a gate
refusal does not (the provider was never asked).

Never-joined machines have one owner each, named in their evidence as ``returned_by``:

- ``reconciler``: the machine has an instance fact. The reconciler plans ``ReturnMachines(reason="never_joined")``
  from the same facts and the same ``join_deadline``; here it is a finding only, and no action is taken.
- ``executor``: no instance fact, but its op tag names an intent that is still open. The executor is still
  polling that request, or will settle it after a restart (``recover_request`` lists the op's machines and commits
  their instance facts), after which the reconciler owns it; acting here would race the executor.
- ``orphan_cycle``: no instance fact and the intent is closed (failed, or fulfilled by other machines), e.g. a
  machine that appeared after its request was written off. Neither the reconciler (it never lists machines) nor
  the executor will ever see it again: the orphan cycle returns it.

Audit events never carry a join token or a credential: evidence holds tags, names, addresses, times and host
states; provider errors are redacted by the runtime before they get here.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from provisionerd.domain.errors import ProviderError, ProvisionerdError
from provisionerd.domain.model import Fact
from provisionerd.execution.orphan_licences import LicenseReads, counted, grants_summary, return_grant
from provisionerd.execution.orphan_offload import (
    OFF_LOOP_AT,
    classify_off_loop,
    collector_paused,
    is_large,
    release_off_loop,
)
from provisionerd.execution.orphan_owners import (  # re-exported: the owners of never-joined machines
    EXECUTOR,
    RECONCILER,
    open_ops_of,
    returned_by,
    with_owners,
)
from provisionerd.execution.orphan_reads import (
    ControllerReader,
    LeaseReader,
    Sifter,
    ViewPeek,
    expected_fleet,
    read_listing,
    unknown_outcomes,
)
from provisionerd.orphans.classify import (
    Classification,
    ClassifierMemory,
    Observation,
    OrphanPolicy,
    PlannedAction,
)
from provisionerd.orphans.model import CLEANUP_ACTIONS, Finding, ListingAbsent, Unreadable, thaw
from provisionerd.provider.client import ProviderReader
from provisionerd.telemetry.events import EventLog


class OrphanExecutor(Protocol):
    """The part of ``provisionerd.execution.executor.Executor`` the orphan cycle uses.

    ``return_machines`` passes the gate with a ``ReturnIntent(op_id, machine_ids, reason)`` stamped with the lease
    epoch, calls ``requestReturnMachines`` (``stopMachines`` when ``stop``), polls and commits ``Returned``; it
    returns a ``ReturnOutcome`` whose ``status`` is ``returned`` (the provider confirmed it), ``dropped`` (the
    gate refused, or the machine is busy in another action: the provider was not asked), or ``partial``,
    ``rejected``, ``unknown`` (the provider failed or did not confirm). ``commit_fact`` commits one fact stamped
    with the epoch held now and returns its log index; it raises ``LeaseError``/``LinkDown``/``ControllerRejected``
    when it cannot.
    """

    async def return_machines(
        self, provider: str, op_id: str, machine_ids: Sequence[str], reason: str, *, stop: bool = False
    ) -> Any: ...

    async def commit_fact(self, fact: Fact) -> int: ...


#: What each automatic (class, action) rests on, for the audit's ``confirmed_by``.
RULES = {
    ("never_joined", "return"): "no host joined within join_deadline of the cloud launch time",
    ("tagged_unknown", "adopt"): "exactly one live host matches it and no tracked machine claims that host",
    ("tagged_unknown", "report"): "this cluster's and provider's tags, no live fact",
    ("tagged_unknown", "stop"): "this cluster's and provider's tags, no live fact, older than orphan_grace",
    ("tagged_unknown", "terminate"): "this cluster's and provider's tags, no live fact, older than orphan_grace",
    ("ghost", "retire"): "missing from ghost_confirmations consecutive listings, no live host",
    ("license", "return"): "the controller counts 0 in use, the licence source agrees, older than orphan_grace",
    ("license", "report"): "units granted but not in use",
}
#: The pass-wide preconditions every automatic action passed (the classifier checked each one).
PRECONDITIONS = ("listing_read", "view_read", "lease_epoch", "primary", "settled", "owner_tags")


@attrs.frozen
class ActionRecord:
    """One action carried out (or tried): ``outcome`` is ok | failed | busy | refused."""

    action: PlannedAction
    outcome: str
    answer: Any


@attrs.frozen
class PassResult:
    classification: Classification
    findings: tuple[Finding, ...]  # with owners (see with_owners)
    actions: tuple[ActionRecord, ...] = ()


class OrphanCycle:
    """The orphan pass for one provider. ``run`` repeats it every ``interval`` seconds until cancelled."""

    def __init__(
        self,
        *,
        cluster: str,
        identity: str,
        provider: str,
        policy: OrphanPolicy,
        client: ProviderReader,
        read_controller: ControllerReader,
        read_lease: LeaseReader,
        executor: OrphanExecutor,
        events: EventLog,
        wall_clock: Callable[[], float] = time.time,
        list_timeout: float | None = None,
        fleet_floor: int = 0,
        peek: ViewPeek | None = None,
    ) -> None:
        """``peek``: the controller's view as the session holds it now, with which each listing page is sifted
        (``orphan_reads.Sifter``); without it the pass holds its whole listing."""
        self.cluster = cluster
        self.identity = identity
        self.provider = provider
        self.policy = policy
        self.memory = ClassifierMemory()
        self._client = client  # reads only: every action goes through the executor
        self._read_controller = read_controller
        self._read_lease = read_lease
        self._executor = executor
        self._events = events
        self._wall_clock = wall_clock
        self._list_timeout = list_timeout
        self._fleet_floor = fleet_floor
        self._expected = fleet_floor
        self._peek = peek
        self._seen: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
        self.licenses = LicenseReads(provider)  # class d: asked only when the plugin declares pools
        self.passes = 0
        self.interval = 0.0  # set by run
        #: Why no pass should run now, as ``(reason, detail)`` (``None``: run it); the daemon sets it (unhealthy
        #: provider, standby daemon). A skipped pass calls nothing and reads nothing; ``skipped`` counts them.
        self.skipped: Counter[str] = Counter()
        self.last_skip: str | None = None

    async def run(
        self,
        interval: float,
        *,
        skip: Callable[[], tuple[str, str] | None] = lambda: None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A pass (unless ``skip`` names a reason: then only an ``orphan_pass`` event with ``skipped: {reason:
        detail}`` and ``listed: false``), then ``interval`` seconds of sleep, forever. A pass survives any failure
        of what it reads or calls (each is audited); only a bug escapes."""
        self.interval = interval  # a reload may set another one; the next sleep takes it
        task_status.started()
        while True:
            why = skip()
            self.last_skip = None if why is None else why[0]
            if why is None:
                await self.run_pass()
            else:
                self.skipped[why[0]] += 1
                self._events.emit("orphan_pass", provider=self.provider, skipped={why[0]: why[1]}, listed=False)
            await trio.sleep(self.interval)

    async def run_pass(self) -> PassResult:
        with collector_paused(self._expected >= OFF_LOOP_AT):  # the listing held: read, classified, released
            result, findings, open_ops = await self._observe_and_classify()
        actions: list[ActionRecord] = []
        if not result.skipped:
            owners = {(f.orphan_class, f.machine_id): returned_by(f, open_ops) for f in findings}
            for action in result.allowed:
                if owners.get((action.orphan_class, action.machine_id)) in (RECONCILER, EXECUTOR):
                    continue
                record = await self._carry_out(action)
                actions.append(record)
                if record.outcome == "refused":
                    break
        return PassResult(result, findings, tuple(actions))

    async def _observe_and_classify(self) -> tuple[Classification, tuple[Finding, ...], frozenset[str]]:
        """Read, classify and audit one observation; the listing and view it read are released before this returns
        (a large one off the loop), so the pass's actions run without them."""
        peek = self._peek
        sifter = None if peek is None else Sifter(self.cluster, self.provider, self.policy, peek, self._wall_clock)
        obs = await observe(
            self.cluster,
            self.provider,
            self._client,
            self._read_controller,
            self._read_lease,
            wall_clock=self._wall_clock,
            list_timeout=self._list_timeout,
            expected=self._expected,
            licenses=self.licenses,
            sifter=sifter,
        )
        self._expected = expected_fleet(obs.view, obs.listed_count, floor=self._fleet_floor)  # the next pass's cap
        result = await classify_off_loop(obs, self.policy, self.memory)
        self.memory = result.memory
        self.passes += 1
        open_ops = open_ops_of(obs.view, self.provider)
        findings = with_owners(result.findings, open_ops)
        self._audit_pass(obs, result, findings)
        if is_large(obs):
            held = [obs]
            del obs
            await release_off_loop(held)
        return result, findings, open_ops

    # --- actions -------------------------------------------------------------------------------------------------

    async def _carry_out(self, action: PlannedAction) -> ActionRecord:
        if action.orphan_class == "license" and action.kind == "return":
            record = await _licence_return(self._executor, action, self.cluster)
        else:
            record = await carry_out(self._executor, action)
        if action.kind in CLEANUP_ACTIONS and record.outcome in ("ok", "failed"):
            self.memory = self.memory.after_cleanup(record.outcome == "ok")
        confirmed_by = {
            "by": "automatic",
            "identity": self.identity,
            "rule": RULES.get((action.orphan_class, action.kind), ""),
            "preconditions": list(PRECONDITIONS),
        }
        audit_action(self._events, action, record, confirmed_by, failed_cleanups=self.memory.failed_cleanups)
        return record

    # --- audit ---------------------------------------------------------------------------------------------------

    def _audit_pass(self, obs: Observation, result: Classification, findings: Sequence[Finding]) -> None:
        absent = obs.listing if isinstance(obs.listing, ListingAbsent) else None
        skipped = {
            name: view.reason
            for name, view in (("listing_unreadable", obs.listing), ("view_unreadable", obs.view))
            if isinstance(view, Unreadable) and view is not absent
        }
        # A provider without a listing is not "unreadable" every pass: it says once per pass what it cannot see.
        extra: dict[str, Any] = {}
        if absent is not None:
            extra = {
                "listing": "absent",
                "invisible": list(absent.invisible),
                "unknown_outcomes": list(unknown_outcomes(self._client)),
            }
        self._events.emit(
            "orphan_pass",
            provider=self.provider,
            **extra,
            findings=len(findings),
            allowed=len(result.allowed),
            machines_listed=obs.listed_count,
            machines_cleared=len(obs.cleared),
            skipped=skipped,
            lease_epoch=obs.lease.epoch if obs.lease.usable else None,
            primary=obs.controller.primary,
            settled=obs.controller.settled,
            licenses=grants_summary(self.licenses.last),
            breaker={
                "open": result.breaker.open,
                "reasons": list(result.breaker.reasons),
                "suspects": result.breaker.suspects,
                "known": result.breaker.known,
            },
        )
        if skipped:
            # A narrowed pass proves nothing about what it did not see: keep the last picture for the next one.
            for finding in findings:
                self._detected(finding)
            return
        current = {(f.orphan_class, f.machine_id) for f in findings}
        if isinstance(self.licenses.last, Unreadable):  # an unread licence source proves no grant went back
            current |= {k for k in self._seen if k[0] == "license"}
        for finding in findings:
            self._detected(finding)
        for key in [k for k in self._seen if k not in current]:
            del self._seen[key]
            self._events.emit("orphan_resolved", provider=self.provider, orphan_class=key[0], machine_id=key[1])

    def _detected(self, finding: Finding) -> None:
        key = (finding.orphan_class, finding.machine_id)
        state = (finding.action, finding.blocked_by)
        if self._seen.get(key) == state:
            return
        self._seen[key] = state
        self._events.emit(
            "orphan_detected",
            provider=finding.provider,
            orphan_class=finding.orphan_class,
            machine_id=finding.machine_id,
            action=finding.action,
            blocked_by=list(finding.blocked_by),
            evidence=thaw(finding.evidence),
        )


async def observe(
    cluster: str,
    provider: str,
    client: ProviderReader,
    read_controller: ControllerReader,
    read_lease: LeaseReader,
    *,
    wall_clock: Callable[[], float] = time.time,
    list_timeout: float | None = None,
    expected: int = 0,
    licenses: LicenseReads | None = None,
    sifter: Sifter | None = None,
) -> Observation:
    """One observation of ``provider``: its listing first, then the controller's view and the lease (the order
    ``Observation`` requires). Shared by the orphan pass and the admin's explicit action
    (``provisionerd.daemon.orphan_admin``); never raises for what it cannot read (``Unreadable``). ``expected``
    (about how many machines the listing should show) caps its pages (``paging.max_pages``). ``licenses``: read
    the provider's licence grants too, after the listing (``orphan_licences``). ``sifter``: sift the listing as it
    is read (``orphan_reads.Sifter``): the observation holds only the ids of the machines it cleared."""
    listing = await read_listing(client, cluster, timeout=list_timeout, expected=expected, sift=sifter)
    cleared: frozenset[str] = frozenset()
    if sifter is not None and isinstance(listing, tuple):
        listing, cleared = sifter.resolve(listing)
    grants = await licenses.read(client, cluster) if licenses is not None else ()
    controller = read_controller()  # after the listing, never before
    return Observation(
        cluster_id=cluster,
        provider=provider,
        now=wall_clock(),
        listing=listing,
        view=controller.view,
        hosts=controller.hosts,
        licenses=counted(grants, controller.licenses_in_use),
        lease=read_lease(),
        controller=controller.controller,
        cleared=cleared,
    )


async def carry_out(executor: OrphanExecutor, action: PlannedAction, *, reason: str | None = None) -> ActionRecord:
    """Carry out one action through ``executor`` (never around it): a return, stop or terminate by
    ``return_machines`` (``reason`` defaults to ``orphan <class>: <kind>``), anything else by committing
    ``action.fact()``. Outcome ``failed`` when the provider failed (it counts towards the breaker), ``refused``
    when the gate refused (lease, link, controller: the provider was never asked), ``busy``, or ``ok``."""
    try:
        if action.kind in ("return", "stop", "terminate"):
            reason = reason if reason is not None else f"orphan {action.orphan_class}: {action.kind}"
            outcome = await executor.return_machines(
                action.provider, action.op_id, (action.machine_id,), reason, stop=action.kind == "stop"
            )
            return ActionRecord(action, return_outcome(outcome), _answer(outcome))
        index = await executor.commit_fact(action.fact())
        return ActionRecord(action, "ok", {"fact_index": index})
    except ProviderError as exc:
        return ActionRecord(action, "failed", {"error": type(exc).__name__, "detail": str(exc)})
    except ProvisionerdError as exc:
        return ActionRecord(action, "refused", {"error": type(exc).__name__, "detail": str(exc)})


async def _licence_return(executor: Any, action: PlannedAction, cluster: str) -> ActionRecord:
    """A licence return (``orphan_licences.return_grant``), with ``carry_out``'s outcomes."""
    try:
        return ActionRecord(action, "ok", await return_grant(executor, action, cluster))
    except ProviderError as exc:
        return ActionRecord(action, "failed", {"error": type(exc).__name__, "detail": str(exc)})
    except ProvisionerdError as exc:
        return ActionRecord(action, "refused", {"error": type(exc).__name__, "detail": str(exc)})


def audit_action(
    events: EventLog, action: PlannedAction, record: ActionRecord, confirmed_by: dict[str, Any], **extra: Any
) -> None:
    """The ``orphan_action`` audit event of one action carried out, whoever confirmed it (``confirmed_by``)."""
    events.emit(
        "orphan_action",
        provider=action.provider,
        orphan_class=action.orphan_class,
        machine_id=action.machine_id,
        action=action.kind,
        op_id=action.op_id,
        epoch=action.epoch,
        evidence=json.loads(action.evidence_json),
        confirmed_by=confirmed_by,
        outcome=record.outcome,
        answer=record.answer,
        **extra,
    )


def return_outcome(outcome: Any) -> str:
    """``ok``, ``busy`` (another action holds the machine), ``refused`` (the gate) or ``failed`` for a
    ``ReturnOutcome`` (see ``OrphanExecutor``)."""
    status = getattr(outcome, "status", None)
    if status == "returned":
        return "ok"
    if status == "dropped":
        return "busy" if getattr(outcome, "code", "") == "busy" else "refused"
    return "failed"


def _answer(outcome: Any) -> Any:
    """A provider outcome as JSON-shaped data for the audit."""
    if attrs.has(type(outcome)):
        return json.loads(json.dumps(attrs.asdict(outcome), default=str))
    if isinstance(outcome, (dict, list, str, int, float, bool)) or outcome is None:
        return outcome
    return repr(outcome)
