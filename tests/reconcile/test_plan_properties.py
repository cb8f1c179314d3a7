"""Hypothesis properties of the planner over arbitrary worlds.

A world is a set of offers, facts in every state (open, fulfilled and failed intents; active, returning, returned
and lost machines, some adopted), hosts in every status, capacity back-off, reclaim notices, a planner state left
by an earlier plan, a policy with caps and a step limit (either the same knobs for every provider, or each
provider its own ``ProviderPolicy``: join deadline, max_ttl, provisioning timeout, step limit, cap), and a snapshot.
"""

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import EPOCH, NOW, World, fuzz_settings, item, offer, snapshot, token_hash

from provisionerd.domain.actions import DrainMachines, FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.domain.model import (
    CommittedFact,
    HostState,
    HostStatus,
    InstanceFact,
    Lost,
    OrphanAdopted,
    RequestFailed,
    RequestIntent,
    ReturnIntent,
)
from provisionerd.planner.capacity import CapacityUnavailable, ProviderUnhealthy, Throttled
from provisionerd.planner.fact_view import FactView, MachineState, fold
from provisionerd.planner.in_flight import InFlight
from provisionerd.planner.offers import Catalog, compatibility_reasons, offer_sort_key
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import PlannerState, Reclaimed, observe

PROVIDERS = ("p", "q")
TEMPLATES = ("t1", "t2", "t3")
DEMANDS = ("d1", "d2", "d3")


@attrs.frozen
class Case:
    offers: tuple
    view: FactView
    facts: tuple
    hosts: dict
    state: PlannerState
    policy: Policy
    snap: object
    now: float
    planned: tuple = ()  # the op book's part: (action, planned_at) of an earlier plan, all still in flight

    def in_flight(self, *more):
        return InFlight.of([*self.planned, *more])


offers_st = st.lists(
    st.builds(
        offer,
        provider=st.sampled_from(PROVIDERS),
        template=st.sampled_from(TEMPLATES),
        max_number=st.integers(0, 8),
        ncpus=st.integers(1, 4),
        gpus=st.integers(0, 1),
        price=st.none() | st.sampled_from([0.1, 0.2, 0.3, 0.5]),
    ),
    min_size=1,
    max_size=6,
)
items_st = st.lists(
    st.builds(
        item,
        demand_id=st.sampled_from(DEMANDS),
        count=st.integers(0, 10),
        ncpus=st.integers(1, 4),
        gpus=st.integers(0, 1),
        cap=st.none() | st.sampled_from([0.15, 0.3, 1.0]),
        providers=st.lists(st.sampled_from(PROVIDERS), max_size=1),
    ),
    max_size=4,
    unique_by=lambda i: i.demand_id,
)


@st.composite
def cases(draw):
    offers = tuple(draw(offers_st))
    facts, hosts = [], {}
    machine_no = 0
    for n in range(draw(st.integers(0, 6))):
        provider, template = draw(st.sampled_from(PROVIDERS)), draw(st.sampled_from(TEMPLATES))
        op_id = f"old{n}"
        count = draw(st.integers(1, 4))
        refs = tuple(f"{op_id}/{i}" for i in range(count))
        facts.append(
            RequestIntent(
                provider,
                EPOCH,
                op_id,
                template,
                count,
                refs,
                tuple(map(token_hash, refs)),
                draw(st.sampled_from(DEMANDS + ("gone",))),
            )
        )
        for i in range(draw(st.integers(0, count))):
            machine_no += 1
            machine_id = f"m{machine_no}"
            launch = NOW - draw(st.sampled_from([0, 100, 1000, 5000])) if draw(st.booleans()) else 0.0
            facts.append(
                InstanceFact(
                    provider, EPOCH, op_id, refs[i], machine_id, template, token_hash(refs[i]), launch_time=launch
                )
            )
            fate = draw(st.sampled_from(["active"] * 4 + ["returning", "returned", "lost"]))
            if fate in ("returning", "returned"):
                facts.append(ReturnIntent(provider, EPOCH, f"ret-{machine_id}", (machine_id,), "idle"))
            if fate == "lost":
                facts.append(Lost(provider, EPOCH, f"lost-{machine_id}", machine_id, "x"))
            status = draw(st.none() | st.sampled_from(list(HostStatus)))
            if status is not None:
                since = NOW - draw(st.sampled_from([0, 100, 400, 2000]))
                hosts[refs[i]] = HostState(refs[i], provider, machine_id, status, since)
        if draw(st.booleans()):
            facts.append(RequestFailed(provider, EPOCH, op_id, "x"))
    if draw(st.booleans()):
        facts.append(OrphanAdopted("p", EPOCH, "adopt", "x1", "ref-x1"))
        hosts["ref-x1"] = HostState("ref-x1", "p", "x1", HostStatus.IDLE, NOW - 1000)
    committed = tuple(CommittedFact(i + 1, f) for i, f in enumerate(facts))
    view = fold(committed)
    own = st.builds(
        ProviderPolicy,
        join_deadline=st.sampled_from([50.0, 900.0, 3000.0]),
        idle_time=st.sampled_from([50.0, 300.0]),
        max_ttl=st.none() | st.sampled_from([500.0, 3000.0]),
        provisioning_timeout=st.sampled_from([50.0, 1200.0]),
        step_limit=st.none() | st.integers(1, 6),
        max_machines=st.none() | st.integers(0, 10),
    )
    per_provider = draw(st.booleans())
    policy = Policy(
        cluster="c1",
        step_limit=draw(st.integers(1, 12)),
        provider_caps={}
        if per_provider
        else draw(st.dictionaries(st.sampled_from(PROVIDERS), st.integers(0, 10), max_size=2)),
        max_ttl=draw(st.none() | st.just(3000.0)),
        provisioning_timeout=draw(st.sampled_from([50.0, 1200.0])),
        idle_time=300.0,
        providers=draw(st.fixed_dictionaries({p: own for p in PROVIDERS})) if per_provider else {},
    )
    state = PlannerState.initial("i0", jitter_seed=draw(st.integers(0, 5)))
    # an earlier plan leaves pending actions, the step log and first-seen times behind
    earlier = NOW - draw(st.sampled_from([0.0, 30.0, 100.0]))
    before = plan(state, snapshot(1, *draw(items_st)), view, offers, hosts, earlier, policy)
    state, planned = before.state, tuple((action, earlier) for action in before.actions)
    backoffs = [CapacityUnavailable(p, t, earlier) for p in PROVIDERS for t in TEMPLATES]
    backoffs += [Throttled(p, earlier, 1.0) for p in PROVIDERS]
    backoffs += [ProviderUnhealthy(p, code, earlier) for p in PROVIDERS for code in ("quota_exceeded", "auth_failed")]
    reclaims = st.lists(st.sampled_from(["m1", "m2", "m3", "zz"])).map(lambda ids: Reclaimed("p", tuple(ids), earlier))
    for obs in draw(st.lists(st.sampled_from(backoffs) | reclaims, max_size=3)):
        state = observe(state, obs, policy).state
    snap = snapshot(draw(st.integers(0, 3)), *draw(items_st))
    return Case(offers, view, committed, hosts, state, policy, snap, NOW, planned)


def run(case, state=None, view=None, in_flight=None):
    return plan(
        case.state if state is None else state,
        case.snap,
        case.view if view is None else view,
        case.offers,
        case.hosts,
        case.now,
        case.policy,
        in_flight=case.in_flight() if in_flight is None else in_flight,
    )


def loads(case, state):
    """Live machines + outstanding + in-flight requests per offer, before planning (as the planner must count)."""
    load = {}
    for m in case.view.machines.values():
        if m.state.live:
            load[(m.provider, m.template_id)] = load.get((m.provider, m.template_id), 0) + 1
    for r in case.view.intents.values():
        key = (r.intent.provider, r.intent.template_id)
        load[key] = load.get(key, 0) + r.outstanding
    for op_id, r in case.in_flight().requests.items():
        if op_id not in case.view.intents:
            load[(r.provider, r.template_id)] = load.get((r.provider, r.template_id), 0) + r.count
    return load


SETTINGS = fuzz_settings(60)


@SETTINGS
@given(cases())
def test_replaying_the_same_snapshot_plans_nothing_new(case):
    first = run(case)
    if case.snap.seq < case.state.applied_seq:
        return
    in_flight = case.in_flight(*((action, case.now) for action in first.actions))
    assert run(case, first.state, in_flight=in_flight).actions == ()  # same view: everything planned is in flight
    # and once the gate has committed every action's fact, still nothing -- unless an intent was failed or a
    # machine marked lost: the plan held their capacity (and the intent's missing machines) until the fact landed,
    # and freeing them is the point of those facts
    if not any(isinstance(a, (FailRequest, MarkLost)) for a in first.actions):
        world = World(list(case.offers), policy=case.policy, view=fold(case.facts), facts=list(case.facts))
        world.commit_actions(first.actions)
        again = run(case, first.state, world.view, in_flight)
        assert again.actions == (), (first.actions, again.actions, first.notes)


@SETTINGS
@given(cases())
def test_never_exceeds_max_number_provider_caps_or_the_step_limit(case):
    result = run(case)
    load = loads(case, case.state)
    requested = {}
    for a in result.actions:
        if isinstance(a, RequestMachines):
            assert a.count > 0
            requested[(a.provider, a.template_id)] = requested.get((a.provider, a.template_id), 0) + a.count
    by_key = Catalog(case.offers).by_key
    for key, n in requested.items():
        assert load.get(key, 0) + n <= by_key[key].offer.max_number
    start = case.now - case.policy.step_interval
    for provider in PROVIDERS:
        new = sum(n for (p, _), n in requested.items() if p == provider)
        own = case.policy.of(provider)
        if new and own.max_machines is not None:
            assert sum(n for (p, _), n in load.items() if p == provider) + new <= own.max_machines
        if own.step_limit is not None:  # each provider's own step limit, in its own window
            window = sum(n for t, p, n in result.state.step_log if t > start and p == provider)
            assert window <= own.step_limit or not new
    recent = sum(n for t, _, n in case.state.step_log if t > start)
    assert recent + sum(requested.values()) <= case.policy.step_limit
    window = sum(n for t, _, n in result.state.step_log if t > start)
    assert window <= case.policy.step_limit


@SETTINGS
@given(cases())
def test_never_picks_a_more_expensive_eligible_offer(case):
    result = run(case)
    catalog = Catalog(case.offers)
    items = {i.demand_id: i for i in case.snap.items}
    load = loads(case, case.state)
    for a in result.actions:
        if isinstance(a, RequestMachines):
            load[(a.provider, a.template_id)] = load.get((a.provider, a.template_id), 0) + a.count
    provider_load = {}
    for (p, _), n in load.items():
        provider_load[p] = provider_load.get(p, 0) + n
    capacity = case.state.capacity
    for a in result.actions:
        if not isinstance(a, RequestMachines):
            continue
        chosen = catalog.by_key[(a.provider, a.template_id)]
        assert not compatibility_reasons(items[a.demand_id], chosen.offer)
        for other in catalog.by_key.values():
            cheaper = offer_sort_key(other) < offer_sort_key(chosen)
            if not cheaper or compatibility_reasons(items[a.demand_id], other.offer):
                continue
            own = case.policy.of(other.key[0])
            cap = own.max_machines
            stepped = sum(
                n for t, p, n in result.state.step_log if t > case.now - case.policy.step_interval and p == other.key[0]
            )
            # a cheaper compatible offer was passed over only because it could not be used
            assert (
                capacity.offer_block(other.key, case.now) is not None
                or load.get(other.key, 0) >= other.offer.max_number
                or (cap is not None and provider_load.get(other.key[0], 0) >= cap)
                or (own.step_limit is not None and stepped >= own.step_limit)
            )


@SETTINGS
@given(cases())
def test_a_stale_snapshot_plans_nothing(case):
    applied = run(case).state
    stale = attrs.evolve(case.snap, seq=applied.applied_seq - 1)
    result = plan(applied, stale, case.view, case.offers, case.hosts, case.now, case.policy)
    assert result.actions == () and result.state is applied
    assert [n.kind for n in result.notes] == ["stale_snapshot"]


@SETTINGS
@given(cases())
def test_every_rejected_offer_is_reported_with_its_reasons(case):
    result = run(case)
    catalog = Catalog(case.offers)
    items = {i.demand_id: i for i in case.snap.items}
    recent = sum(n for t, _, n in case.state.step_log if t > case.now - case.policy.step_interval)
    bought = sum(a.count for a in result.actions if isinstance(a, RequestMachines))
    step_exhausted = recent + bought >= case.policy.step_limit
    for decision in result.decisions:
        rejected = {(r.provider, r.template_id): r.reasons for r in decision.rejected}
        used = {key for key, _ in decision.requested}
        for key, parsed in catalog.by_key.items():
            reasons = compatibility_reasons(items[decision.demand_id], parsed.offer)
            if reasons:
                assert rejected[key] == reasons
            elif key in rejected:
                assert key not in used and len(rejected[key]) == 1
        if decision.unmet and not step_exhausted:
            # demand left unmet: every compatible offer was either used to the full or says why not
            for key, parsed in catalog.by_key.items():
                if not compatibility_reasons(items[decision.demand_id], parsed.offer):
                    assert key in used or key in rejected


@SETTINGS
@given(cases())
def test_new_op_ids_are_fresh_and_in_flight_until_committed(case):
    result = run(case)
    fresh = [a.op_id for a in result.actions if not isinstance(a, FailRequest)]
    assert len(fresh) == len(set(fresh))
    for op_id in fresh:
        assert op_id.startswith("c1:") and ":i0:" in op_id
        assert op_id not in case.view.intents and op_id not in case.view.returns
        assert op_id not in case.in_flight().requests
    for a in result.actions:
        if isinstance(a, FailRequest):
            assert case.view.intents[a.op_id].open
    # nothing retires a busy machine (but at its drain timeout), or one already on its way out; only busy machines
    # are asked to drain (planner.drain)
    returns = [a for a in result.actions if isinstance(a, ReturnMachines)]
    retired = [m for a in returns for m in a.machine_ids]
    assert len(retired) == len(set(retired))
    for action in returns:
        for machine_id in action.machine_ids:
            machine = case.view.machines[machine_id]
            assert machine.state is MachineState.ACTIVE
            host = case.hosts.get(machine.instance_ref)
            assert host is None or host.status is not HostStatus.BUSY or action.reason == "drain_timeout"
            assert machine_id not in case.in_flight().returns
    for action in result.actions:
        if isinstance(action, DrainMachines):
            for machine_id in action.machine_ids:
                machine = case.view.machines[machine_id]
                assert case.hosts[machine.instance_ref].status is HostStatus.BUSY and machine_id not in retired


@SETTINGS
@given(cases(), st.integers(0, 60))
def test_the_view_host_table_plans_exactly_as_a_plain_dict_of_hosts(case, split):
    """The kept join index (hosts written into the view's table, part before and part after the facts) gives the
    same plan as the index built from a plain dict. A pass between the two halves makes the table keep its idle
    entries and the view its demand balance (``FactView.balance``) from then on, as the facts and hosts change."""
    view = fold(case.facts[:split])
    hosts = list(case.hosts.values())
    for host in hosts[: split % (len(hosts) + 1)]:
        view.hosts[host.instance_ref] = host
    plan(case.state, case.snap, view, case.offers, view.hosts, case.now, case.policy, in_flight=case.in_flight())
    fold(case.facts[split:], view)
    for host in hosts[split % (len(hosts) + 1) :]:
        view.hosts[host.instance_ref] = host
    table = plan(
        case.state, case.snap, view, case.offers, view.hosts, case.now, case.policy, in_flight=case.in_flight()
    )
    plain = run(case)
    assert attrs.evolve(table, wake_at=None) == attrs.evolve(plain, wake_at=None)
    # The table's indexes read only the machines that may act now and wake at a lower bound for the rest (the
    # earliest launch after the cutoff plus the shortest join deadline or max_ttl): never later than the exact wake
    # a pass over every machine gives, possibly earlier (a wake that only replans).
    if plain.wake_at is not None:
        assert table.wake_at is not None and table.wake_at <= plain.wake_at


@SETTINGS
@given(cases())
def test_every_deadline_is_the_machines_own_providers(case):
    """A machine is returned for a deadline only once its own provider's deadline has passed, and an intent failed
    only past its own provider's provisioning timeout: another provider's shorter limit never reaches it."""
    result = run(case)
    for action in result.actions:
        own = case.policy.of(action.provider)
        if isinstance(action, FailRequest):
            seen = case.state.intent_seen.get(action.op_id, case.now)
            assert case.now - seen >= own.provisioning_timeout
        if isinstance(action, DrainMachines):
            for machine_id in action.machine_ids:
                machine = case.view.machines[machine_id]
                launched = machine.launch_time if machine.launch_time > 0 else case.state.machine_seen.get(machine_id)
                assert own.max_ttl is not None and launched is not None and case.now - launched >= own.max_ttl
        if not isinstance(action, ReturnMachines):
            continue
        for machine_id in action.machine_ids:
            machine = case.view.machines[machine_id]
            assert machine.provider == action.provider
            launched = machine.launch_time if machine.launch_time > 0 else case.state.machine_seen.get(machine_id)
            if action.reason == "never_joined":
                assert launched is not None and case.now - launched >= own.join_deadline
            elif action.reason == "max_ttl":
                assert own.max_ttl is not None and launched is not None and case.now - launched >= own.max_ttl
            elif action.reason == "idle":
                host = case.hosts[machine.instance_ref]
                assert case.now - host.since >= own.idle_time


@SETTINGS
@given(cases())
def test_an_unhealthy_provider_is_asked_nothing(case):
    """No request to an unhealthy provider, nor a return unless it is unhealthy only for quota."""
    result = run(case)
    capacity = case.state.capacity
    for action in result.actions:
        if isinstance(action, RequestMachines):
            assert action.provider not in capacity.unhealthy
        if isinstance(action, ReturnMachines):
            assert not capacity.refuses(action.provider, returning=True)
