"""The reconcile loop: plan from the controller's view and the offers, execute the actions, replan on every change.

One cycle (``cycle``) is synchronous: it reads the current ``ControllerView`` (complete: resynced *and* a demand
snapshot on this link), the leases and the offer feed, runs the pure planner, and starts each action in the loop's
nursery under a ``CapacityLimiter``. It plans nothing when

- the link is not up or the view is incomplete (after a rejoin, the loop's inputs are the new view's alone);
- no provider lease is valid (providers without one get no offers and their actions are dropped back to the
  planner, which plans them again once the lease is back; the gate would refuse them anyway);
- the offers of a leased provider could not be read recently (a cycle that could not read its inputs acts not).

The loop composes parts that each do one job, and owns what they share: the planner state (``apply`` folds an
observation into it and wakes the loop), the nursery their tasks run in and the ``CapacityLimiter`` they run under.

- ``operations.Operations``, the one owner of the ops this process runs: it starts each planned action (one whose
  op_id or machines are still running is not started, and replanned later: never two actions on one machine), and
  its op book is the one record of what is in flight (each plan reads ``Operations.in_flight``), hands open intents
  and returns no task runs (a restart, a commit whose ack was lost, an unknown outcome) to
  ``Executor.recover_request`` / ``resume_return`` once idle for ``recover_after`` seconds, and keeps what the
  outcomes mean (settled requests, failing returns' back-off) in each op's record (``op_book``). What a call means
  for the planner (throttle back-off, offer unavailable, quota pause) comes on the feedback channel
  (``execution.feedback``) and is folded at once; every outcome wakes the loop;
- ``reclaims.ReclaimPoll``: the ``getReturnRequests`` poll.

Replanning happens on every change of the session (demand, hosts, facts, link), of a lease, of the offers, after
every action's outcome, at the next deadline the planner knows of (an idle machine's ``idle_time``, a join
deadline, a ``max_ttl``, a provisioning timeout, the step window freeing room, a back-off's end:
``planner.deadlines``), and at the latest ``replan_interval`` seconds after the last cycle. ``getReturnRequests`` is
polled every ``reclaim_interval`` with every live machine of each leased provider.

Clocks: the planner's ``now`` is ``wall()`` (wall-clock seconds, the clock of launch times and host ``since``);
everything the loop waits for runs on trio's clock. Tests pass ``wall=lambda: BASE + trio.current_time()``.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.session_settings import LinkState
from provisionerd.controller.view import ControllerView
from provisionerd.domain.actions import Note
from provisionerd.domain.errors import ProvisionerdError, describe_error
from provisionerd.domain.model import CommittedFact, DemandSnapshot
from provisionerd.execution.executor import Executor
from provisionerd.execution.loop_inputs import LoopSettings, ViewSource
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.execution.operations import Operations
from provisionerd.execution.reclaims import ReclaimPoll
from provisionerd.planner import windows
from provisionerd.planner.capacity import ProbeStarted, ProbeSucceeded
from provisionerd.planner.deadlines import next_deadline
from provisionerd.planner.health import status as machine_health
from provisionerd.planner.host_table import join_index
from provisionerd.planner.offers import Catalog
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy
from provisionerd.planner.ramp import Ramp, bounds, changes
from provisionerd.planner.rejoin import Rejoin, Window
from provisionerd.planner.state import (
    Observation,
    PlannerState,
    SnapshotSeqReset,
    observe,
    ramp_step,
)
from provisionerd.telemetry.events import EventLog

__all__ = ["LoopSettings", "ReconcileLoop", "ViewSource"]

log = logging.getLogger(__name__)

DEFAULT_SETTINGS = LoopSettings()
#: The longest the first plan after a start waits for the health windows' read (``ReconcileLoop._read_windows``).
WINDOWS_READ_FOR = 10.0
#: Where that read stands: not started, under way, over (read, failed or not needed).
_UNREAD, _READING, _READ = "unread", "reading", "read"
#: ``(providers, since wall time, up to log index) -> facts``: ``controller.history.recent_facts`` over a session.
RecentFacts = Callable[[Sequence[str], float, int], Awaitable[Sequence[CommittedFact]]]


class ReconcileLoop:
    def __init__(
        self,
        session: ViewSource,
        leases: Mapping[str, LeaseKeeper],
        executor: Executor,
        feed: OfferFeed,
        policy: Policy | Callable[[], Policy],
        events: EventLog,
        *,
        settings: LoopSettings = DEFAULT_SETTINGS,
        wall: Callable[[], float] = time.time,
        incarnation: str | None = None,
        jitter_seed: int = 0,
        view_ready: Callable[[str], bool] | None = None,
        feedback: trio.MemoryReceiveChannel[Observation] | None = None,
        recent_facts: RecentFacts | None = None,
    ) -> None:
        self.session = session
        #: What provider calls meant for the planner (the executor's and the offer feed's: ``execution.feedback``).
        self._feedback = feedback
        self.leases = leases
        self.executor = executor
        self.feed = feed
        # A callable is read at every use (the daemon's current-config holder: a reload's limits apply at once).
        self._policy = policy if callable(policy) else (lambda: policy)
        self.events = events
        self.settings = settings
        self.wall = wall
        # Whether the view may be planned from for a provider (the daemon: resynced since its last lease grant).
        self.view_ready = view_ready if view_ready is not None else (lambda _provider: True)
        self.state = PlannerState.initial(incarnation or secrets.token_hex(4), jitter_seed)
        self.cycles = 0
        self.turns = 0  # every cycle() call, planned or skipped: the systemd watchdog's "the loop turns"
        self.beat: float | None = None  # trio's clock at the loop's last turn (``/healthz`` reads it)
        self._generation: int | None = None
        #: The settle window of the current controller generation (planner.rejoin); shown in ``status``.
        self.rejoin = Rejoin(float("-inf"), frozenset())
        #: The session's resync want that confirms the hosts before a retirement for not joining (planner.rejoin).
        self._confirm_want: int | None = None
        self._dirty = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._catalog_key: tuple[object, ...] | None = None
        self._catalog = Catalog(())
        #: Whether the demand of snapshot ``_gang_seq`` holds an all-or-nothing item; a features read under way.
        self._gang_seq, self._gang_wanted, self._features_reading = -1, False, False
        self._last_notes: set[tuple[str, str, str, str]] = set()
        self._skip = ""
        self._wake_at: float | None = None  # the last plan's ``wake_at`` (wall)
        #: The one owner of the ops this process runs (dispatch, recovery, outcomes).
        self.operations = Operations(executor, events, settings, wall=wall)
        self.outcomes: list[Any] = self.operations.recent  # every outcome, for tests and status (bounded)
        #: Reads the facts committed since a wall time (``controller.history.recent_facts`` over the session): the
        #: health windows a restart lost are rebuilt from them before the first plan (``planner.windows``).
        self._recent_facts = recent_facts
        self._windows = _UNREAD
        self._reclaims = ReclaimPoll(
            session, executor, events, settings.reclaim_interval, leased=self.askable, apply=self.apply, wall=wall
        )

    @property
    def policy(self) -> Policy:
        """The planner policy in force now."""
        return self._policy()

    # --- observations -------------------------------------------------------------------------------------------

    def apply(self, obs: Observation) -> None:
        """Fold one observation into the planner state and replan."""
        before = self.state.ramps
        observed = observe(self.state, obs, self.policy)
        self.state = observed.state
        if self.state.ramps is not before:
            self._steps_changed(before)
        self._emit_notes(observed.notes, dedupe=False)
        for note in observed.notes:
            if note.kind == "provider_unhealthy":
                entry = self.state.capacity.unhealthy[note.provider]
                self.events.emit(
                    "provider_unhealthy",
                    provider=note.provider,
                    code=entry.code,
                    detail=entry.detail,
                    failures=entry.attempts,
                    next_probe_in=round(entry.until - self.wall(), 3),
                )
            elif note.kind == "provider_healthy":
                self.events.emit("provider_healthy", provider=note.provider, detail=note.detail)
        self.wake()

    def _steps_changed(self, before: Mapping[str, Ramp]) -> None:
        """A ``step_changed`` event per provider whose adaptive step moved (``planner.ramp``)."""
        policy = self.policy
        limits = {}
        for provider in self.state.ramps:
            own = policy.of(provider)
            if own.step_limit is not None:
                limits[provider] = (own.step_limit, own.max_machines)
        for provider, old, new, reason in changes(before, self.state.ramps, limits):
            log.info("provider %s: step %d -> %d (%s)", provider, old, new, reason)
            self.events.emit("step_changed", provider=provider, old=old, new=new, reason=reason)

    def steps(self) -> dict[str, dict[str, Any]]:
        """Each served provider's adaptive step, for ``provisionerd status``: ``step`` (machines per
        ``step_interval`` in force now), ``floor`` (its ``step_limit``), ``cap`` and why it last changed (``None``
        for a provider without its own step limit)."""
        policy = self.policy
        found: dict[str, dict[str, Any]] = {}
        for provider in self.leases:
            own = policy.of(provider)
            step = ramp_step(self.state.ramps, provider, policy)
            if step is None or own.step_limit is None:
                found[provider] = {"step": None, "floor": None, "cap": own.max_machines, "reason": None}
                continue
            ramp = self.state.ramps.get(provider)
            found[provider] = {
                "step": step,
                "floor": own.step_limit,
                "cap": bounds(own.step_limit, own.max_machines)[1],
                "interval_s": policy.step_interval,
                "reason": "start" if ramp is None else ramp.reason,
            }
        return found

    def settle_windows(self) -> dict[str, dict[str, Any]]:
        """Each served provider's settle window after the last (re)join to the controller (planner.rejoin), for
        ``provisionerd status``: ``settled``, ``until`` (wall clock), ``settle_s`` (its ``rejoin_settle``), and
        ``missing``: machines that joined before and have no host now."""
        view, policy, now = self.session.view, self.policy, self.wall()
        if view is None:
            return {}
        rejoin = attrs.evolve(self.rejoin, joined_before=view.joined)
        window = Window(
            rejoin, join_index(view.facts.active_refs, view.hosts).unjoined, now, lambda p: policy.of(p).rejoin_settle
        )
        return {
            provider: {
                "settled": window.settled(provider),
                "until": round(window.until(provider), 3) if math.isfinite(window.until(provider)) else None,
                "settle_s": policy.of(provider).rejoin_settle,
                "missing": window.missing(provider),
            }
            for provider in self.leases
        }

    def unhealthy(self, provider: str) -> bool:
        """Whether ``provider`` is unhealthy now: no request is asked of it, its offers are read only by its probe
        (planner state)."""
        return provider in self.state.capacity.unhealthy

    def provider_health(self) -> dict[str, dict[str, Any]]:
        """Each served provider's health, for ``provisionerd status``: ``healthy``, or ``unhealthy`` with the code,
        the provider's message, how long it has been so, the failures in a row and when the next probe is due."""
        now = self.wall()
        health: dict[str, dict[str, Any]] = {}
        view = self.session.view
        live = {} if view is None else view.facts.live_by_provider
        for provider in self.leases:
            entry = self.state.capacity.unhealthy.get(provider)
            # Its machines' health (planner.health): shown once it has a max_unhealthy or an unhealthy machine.
            own = self.policy.of(provider)
            machines = machine_health(self.state.unhealthy, provider, live.get(provider, 0), now, own)
            shown = {"machines": machines} if machines["unhealthy"] or machines["max_unhealthy"] is not None else {}
            if entry is None:
                health[provider] = {"state": "healthy", **shown}
                continue
            health[provider] = {
                **shown,
                "state": "unhealthy",
                "code": entry.code,
                "detail": entry.detail,
                "for_s": round(now - entry.since, 3),
                "failures": entry.attempts,
                "next_probe_in_s": round(max(entry.until - now, 0.0), 3),
                "returns_wait": entry.blocks_returns,
            }
        return health

    def _start_probes(self) -> None:
        """Probe each served provider whose unhealthy back-off step has ended: one ``getAvailableTemplates`` read
        (no intent, no token). ``ProbeStarted`` sets the next step at once, so a probe that hangs or fails without
        a typed refusal costs one call per step."""
        now = self.wall()
        for provider in self.leases:
            if self.state.capacity.probe_due(provider, now):
                self.apply(ProbeStarted(provider, now))
                self._spawn(self._probe, provider)

    async def _probe(self, provider: str) -> None:
        failures = await self.feed.refresh([provider])  # a failure's observation comes on the feedback channel
        if provider not in failures:
            self.apply(ProbeSucceeded(provider, self.wall()))

    def wake(self) -> None:
        self._dirty.set()

    def _emit_notes(self, notes: tuple[Note, ...], *, dedupe: bool = True) -> None:
        keys = set()
        for note in notes:
            key = (note.kind, note.provider, note.demand_id, note.detail)
            keys.add(key)
            if not dedupe or key not in self._last_notes:
                rules = {"rules": list(note.rules)} if note.rules else {}
                self.events.emit(
                    "plan_note",
                    kind=note.kind,
                    provider=note.provider,
                    demand_id=note.demand_id,
                    detail=note.detail,
                    **rules,
                )
        if dedupe:
            self._last_notes = keys

    # --- the loop -----------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Started (waiting) before the first cycle: a change between that cycle and the wait is not lost.
            await nursery.start(self._watch, self.session.changed)
            await nursery.start(self._watch, self.feed.wait_changed)
            await nursery.start(self.operations.run)
            await nursery.start(self._watch, self.operations.wait_changed)
            for keeper in self.leases.values():
                await nursery.start(self._watch, keeper.wait_changed)
            nursery.start_soon(self._reclaims.run)
            if self._feedback is not None:
                nursery.start_soon(self._fold_feedback, self._feedback)
            task_status.started()
            while True:
                self.beat = trio.current_time()
                self._dirty = trio.Event()
                self.cycle()
                with trio.move_on_at(self._next_cycle_at()):
                    await self._dirty.wait()

    def _spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def _next_cycle_at(self) -> float:
        """The timer (trio's clock): the next deadline the planner knows of (``planner.deadlines.next_deadline``: an
        idle machine reaching its ``idle_time``, a join deadline, a ``max_ttl``, a provisioning timeout, the step
        window freeing room, a back-off window ending), never later than ``replan_interval`` from now."""
        now, wall_now = trio.current_time(), self.wall()
        deadline = next_deadline(self.state, wall_now, self._wake_at)
        wait = self.settings.replan_interval
        if deadline is not None:
            wait = min(wait, deadline - wall_now)
        return now + wait

    async def _watch(self, changed: Callable[[], Any], *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()  # no checkpoint until changed() is waiting
        while True:
            await changed()
            self.wake()

    def _skipped(self, why: str) -> None:
        if why and why != self._skip:
            self.events.emit("reconcile_skipped", reason=why)
        self._skip = why

    def leased(self) -> list[str]:
        """Providers whose lease is valid now and whose view is ready (a lease without a resync since its grant
        waits: until then the view may lack the facts the previous holder committed)."""
        now = trio.current_time()
        return [name for name, keeper in self.leases.items() if keeper.valid(now) and self.view_ready(name)]

    def askable(self) -> list[str]:
        """The leased providers that may be called besides a request (the reclaim poll's list): not unhealthy, or
        unhealthy only for requests (``quota_exceeded``)."""
        return [name for name in self.leased() if not self.state.capacity.refuses(name, returning=True)]

    def _catalog_for(self, leased: list[str]) -> Catalog:
        priorities = self.policy.priorities  # a reload may change them: part of the key
        templates = self.policy.template_priorities
        unverified = self.policy.unverified
        gang = self.gang
        key = (
            self.feed.version,
            tuple(leased),
            tuple(sorted(priorities.items())),
            tuple(sorted(templates.items())),
            unverified,
            gang,
        )
        if key != self._catalog_key:
            allowed = set(leased)
            offers = (p.offer for p in self.feed.catalog.by_key.values() if p.offer.provider in allowed)
            self._catalog = Catalog(offers, priorities, templates, unverified, gang)
            self._catalog_key = key
        return self._catalog

    @property
    def gang(self) -> frozenset[str]:
        """The providers whose plugins declare ``features.allOrNothing`` (``Catalog.gang``, ``planner.gang``), as far
        as ``describeProvider`` has been asked (``_want_features``)."""
        book = self.executor.features
        return frozenset(p for p in self.leases if (f := book.known(p)) is not None and f.all_or_nothing)

    def _want_features(self, snapshot: DemandSnapshot | None, leased: list[str]) -> None:
        """While the demand holds an all-or-nothing item, ask each leased provider whose features are not known for
        them (``describeProvider``, once; one read at a time), and plan again when they come. Nobody is asked
        while no item needs it: a plugin is not called for what no decision reads."""
        if snapshot is None or self._features_reading or self._nursery is None:
            return
        if self._gang_seq != snapshot.seq:
            self._gang_seq, self._gang_wanted = snapshot.seq, any(i.all_or_nothing for i in snapshot.items)
        book = self.executor.features
        unknown = [p for p in leased if book.known(p) is None]
        if self._gang_wanted and unknown:
            self._features_reading = True
            self._spawn(self._read_features, unknown)

    async def _read_features(self, providers: list[str]) -> None:
        learned = False
        try:
            for provider in providers:  # a failure is asked again at a later cycle (not at once: no wake for it)
                learned |= await self.executor.features.read(provider) is not None
        finally:
            self._features_reading = False
        if learned:
            self.wake()

    def cycle(self) -> None:
        """One plan-and-dispatch pass (synchronous; actions run in the loop's nursery)."""
        self.turns += 1
        if self._nursery is not None:
            self._start_probes()
        view = self.session.view
        if view is None or self.session.state is not LinkState.UP or not view.complete:
            return self._skipped("controller view incomplete")
        if view.generation != self._generation:
            # A (re)join: the settle window starts (planner.rejoin); on the first view of this process the set of
            # machines seen joined says nothing of the time before it.
            now = self.wall()
            first = now if self._generation is None else self.rejoin.first_view
            self.rejoin = Rejoin(now, view.joined, first_view=first)
            self._generation = view.generation
            self.state = observe(self.state, SnapshotSeqReset(), self.policy).state
            self.operations.forget_idle()
        leased = self.leased()
        if not leased:
            return self._skipped("no provider lease")
        if self.state.intents_refused_until(self.wall()) is not None:  # the controller refused intents: wait
            return self._skipped("controller refused intents: backing off")
        # An unhealthy provider is not read (only probed): its offers are not waited for, and the planner asks
        # nothing of it anyway. A provider read once keeps its last good offers through failed reads: returns and
        # retirements go on; new machines come only from offers younger than the feed's max_age.
        if not self.feed.known([name for name in leased if not self.unhealthy(name)]):
            return self._skipped("offers not read")
        if self._windows is not _READ and self._windows_pending(leased, view):
            return self._skipped("reading the health windows from the history")
        self._skipped("")
        self._want_features(view.demand, leased)
        self.cycles += 1
        want = self._confirm_want
        confirmed = want is not None and view.sync_seq >= want
        now = self.wall()
        result = plan(
            self.state,
            view.demand,
            view.facts,
            self._catalog_for(leased),
            view.hosts,
            now,
            self.policy,
            attrs.evolve(self.rejoin, joined_before=view.joined, hosts_confirmed=confirmed),
            self.operations.in_flight(),
        )
        if confirmed:
            self._confirm_want = None  # used: the next retirement for not joining asks again
        if result.confirm_joins and self._confirm_want is None:
            self._confirm_want = self.session.request_resync()
        self.state = result.state
        self._wake_at = result.wake_at
        self._emit_notes(result.notes)
        allowed = set(leased)
        offered = {name for name in leased if self.feed.fresh([name])}  # requests only on offers not stale
        # An action not started is not in flight: the next plan plans its work again (quietly: waking the loop for
        # it would only plan it again at once).
        self.operations.dispatch(result.actions, allowed, offered, view, self.state.capacity, now)
        self.operations.recover(view, allowed, self.state.capacity)

    # --- the health windows a restart lost (planner.windows) --------------------------------------------------------

    def _windows_pending(self, leased: list[str], view: ControllerView) -> bool:
        """Whether the first plan waits for the windows: it starts their read (once per process) when a provider
        this daemon leases has a window to fill (``windows.span``) and a reader is there, and waits until it ends."""
        if self._windows is _READING:
            return True
        span = windows.span(self.policy, leased)
        if self._recent_facts is None or span <= 0 or self._nursery is None:
            self._windows = _READ
            return False
        self._windows = _READING
        self._spawn(self._read_windows, tuple(leased), span, view.facts.last_index)
        return True

    async def _read_windows(self, leased: tuple[str, ...], span: float, last_index: int) -> None:
        """Read the facts of the last ``span`` seconds, rebuild the windows and put them under the planner's state;
        within ``WINDOWS_READ_FOR`` seconds, else (or when the controller cannot say) the windows start empty, as
        they did before, and that is said (``windows_not_restored``)."""
        assert self._recent_facts is not None
        started = self.wall()
        try:
            with trio.fail_after(WINDOWS_READ_FOR):
                facts = await self._recent_facts(leased, started - span, last_index)
        except (trio.TooSlowError, ProvisionerdError) as exc:
            self.events.emit("windows_not_restored", providers=list(leased), reason=describe_error(exc))
        else:
            found = windows.rebuilt(facts, self.wall(), self.policy, before=started)
            self.state = windows.merged(self.state, found)
            self.events.emit(
                "windows_restored",
                providers=list(leased),
                facts=len(facts),
                unhealthy=len(found.unhealthy),
                disruptions=sum(n for _, _, n in found.disruptions),
            )
        finally:
            self._windows = _READ
            self.wake()

    async def _fold_feedback(self, feedback: trio.MemoryReceiveChannel[Observation]) -> None:
        """Fold each observation a provider call made (``execution.feedback``) as it arrives."""
        async for obs in feedback:
            self.apply(obs)

    async def poll_reclaims(self, provider: str, view: ControllerView) -> None:
        """Ask ``provider`` which of its live machines it takes back; fold them as ``Reclaimed``."""
        await self._reclaims.poll(provider, view)
