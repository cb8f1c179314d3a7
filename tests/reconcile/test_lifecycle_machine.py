"""A stateful test of the pure core: the planner, a model driver and a model provider, under faults and time.

The driver does what the mutation gate and runtime will do: for every ``RequestMachines`` it commits the
``RequestIntent`` first (or the gate refuses and the planner is told ``ActionDropped``), then calls the model
provider, whose outcome the test draws: fulfilled, partial, capacity/throttle/quota failure, slow (machines come
later), or a crash after the provider acted (outcome unknown, recovered by listing the op_id's tag before the intent
may be failed). Hosts join, go idle and busy; the provider reclaims machines; time jumps.

Invariants: every machine the model provider created is in a fact or belongs to an open intent; no op_id creates
machines twice; nothing is created without its committed intent; maxNumber, provider caps and the step limit
hold; replaying a plan against the same view plans nothing; a stale snapshot plans nothing; and when faults stop
and demand holds still, the system converges to the demand.
"""

from __future__ import annotations

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from reconcile_world import EPOCH, World, fuzz_settings, item, offer, snapshot

from provisionerd.domain.actions import FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus, InstanceFact, RequestFailed
from provisionerd.planner.capacity import (
    CallSucceeded,
    CapacityUnavailable,
    ProbeStarted,
    ProbeSucceeded,
    ProviderUnhealthy,
    Throttled,
)
from provisionerd.planner.fact_view import MachineState
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import Reclaimed, observe

OFFERS = [
    offer("p", "small", max_number=4, ncpus=4, price=0.1),
    offer("p", "big", max_number=6, ncpus=8, price=0.4),
    offer("q", "alt", max_number=5, ncpus=4, price=0.2),
    offer("q", "free", max_number=3, ncpus=4, price=None),
]
POLICY = Policy(
    cluster="c1",
    step_limit=6,
    step_interval=60.0,
    provider_caps={"q": 6},
    idle_time=300.0,
    join_deadline=900.0,
    provisioning_timeout=1200.0,
    max_ttl=7200.0,
)
OUTCOMES = ["fulfil", "fulfil", "partial", "capacity", "throttle", "quota", "slow", "crash", "refuse"]

# Demand the caps can always meet: at most one item needing 8 CPUs (only p/big fits: 6 max), the rest 4 CPUs.
demand_st = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)).map(
    lambda counts: (
        item("a", counts[0], ncpus=2),
        item("b", counts[1], ncpus=4, cap=0.3),
        item("c", counts[2], ncpus=8),
    )
)


@attrs.define
class ModelProvider:
    """Creates machines for op_ids, once per op_id; remembers every machine it ever created."""

    world: World
    created: dict[str, list[str]] = attrs.field(factory=dict)  # op_id -> machine ids
    owner: dict[str, str] = attrs.field(factory=dict)  # machine_id -> op_id
    alive: set[str] = attrs.field(factory=set)
    counter: int = 0

    def create(self, op_id: str, n: int) -> list[str]:
        record = self.world.view.intents.get(op_id)
        assert record is not None, f"{op_id} called without a committed intent"
        already = len(self.created.get(op_id, ()))
        assert already == 0 or op_id in self.slow_ok, f"{op_id} creates machines twice"
        assert already + n <= record.intent.count
        made = []
        for _ in range(n):
            self.counter += 1
            machine_id = f"vm{self.counter}"
            made.append(machine_id)
            self.owner[machine_id] = op_id
            self.alive.add(machine_id)
        self.created.setdefault(op_id, []).extend(made)
        return made

    slow_ok: set[str] = attrs.field(factory=set)  # ops created in several steps by one call (slow fulfilment)

    def terminate(self, op_id: str, machine_ids: tuple[str, ...]) -> None:
        record = self.world.view.returns.get(op_id)
        assert record is not None and set(machine_ids) <= set(record.intent.machine_ids), f"{op_id} without intent"
        self.alive.difference_update(machine_ids)


class ReconcileMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(list(OFFERS), policy=POLICY)
        self.provider = ModelProvider(self.world)
        self.snap = snapshot(0)
        self.unknown: set[str] = set()  # crashed calls: the provider acted, the driver did not hear back
        self.slow: dict[str, int] = {}  # op_id -> machines the provider will still create
        self.requests: list[tuple[float, int]] = []  # (time, machines) of every RequestMachines planned
        self.op_ids: set[str] = set()

    # --- the driver ------------------------------------------------------------------------------------------

    def commit_instances(self, op_id: str, machine_ids: list[str]) -> None:
        record = self.world.view.intents[op_id]
        intent = record.intent
        for machine_id in machine_ids:
            i = len(record.machine_ids)
            self.world.commit(
                InstanceFact(
                    intent.provider,
                    EPOCH,
                    op_id,
                    intent.instance_refs[i],
                    machine_id,
                    intent.template_id,
                    intent.token_hashes[i],
                    launch_time=self.world.now,
                )
            )

    def recover(self, op_id: str) -> None:
        """After an unknown outcome: list the provider's machines tagged with the op_id and commit what is new."""
        self.unknown.discard(op_id)
        known = self.world.view.intents[op_id].machine_ids
        self.commit_instances(op_id, [m for m in self.provider.created.get(op_id, []) if m not in known])

    def execute(self, actions, outcome: str) -> None:
        world = self.world
        for action in actions:
            match action:
                case RequestMachines():
                    self.requests.append((world.now, action.count))
                    if outcome == "refuse":
                        world.drop(action.op_id)
                        continue
                    world.commit_actions([action])  # the intent first: no call without it
                    self.call_provider(action, outcome)
                case ReturnMachines():
                    world.commit_actions([action])  # the return intent first, then the call
                    self.provider.terminate(action.op_id, action.machine_ids)
                    world.returned(action)
                case MarkLost():
                    world.commit_actions([action])
                case FailRequest():
                    # the outcome may be unknown: look for the op's machines before closing the intent
                    self.recover(action.op_id)
                    self.slow.pop(action.op_id, None)  # the provider is told to give up
                    world.commit_actions([action])

    def call_provider(self, action: RequestMachines, outcome: str) -> None:
        world, op_id, provider = self.world, action.op_id, action.provider
        if outcome == "fulfil":
            self.commit_instances(op_id, self.provider.create(op_id, action.count))
            world.state = observe(world.state, CallSucceeded(provider), POLICY).state
        elif outcome == "partial":
            self.commit_instances(op_id, self.provider.create(op_id, action.count // 2))
            world.commit(RequestFailed(provider, EPOCH, op_id, "partial"))
        elif outcome in ("capacity", "throttle", "quota"):
            world.commit(RequestFailed(provider, EPOCH, op_id, outcome))
            obs = {
                "capacity": CapacityUnavailable(provider, action.template_id, world.now),
                "throttle": Throttled(provider, world.now),
                "quota": ProviderUnhealthy(provider, "quota_exceeded", world.now, "model quota"),
            }[outcome]
            world.state = observe(world.state, obs, POLICY).state
        elif outcome == "slow":
            self.provider.slow_ok.add(op_id)
            self.slow[op_id] = action.count
        elif outcome == "crash":
            self.provider.create(op_id, action.count)
            self.unknown.add(op_id)

    def reconcile_once(self, outcome: str) -> tuple:
        world = self.world
        for provider in sorted(world.state.capacity.unhealthy):  # the driver's probe, when due, succeeds here
            if world.state.capacity.probe_due(provider, world.now):
                world.state = observe(world.state, ProbeStarted(provider, world.now), POLICY).state
                world.state = observe(world.state, ProbeSucceeded(provider, world.now), POLICY).state
        result = world.plan(self.snap)
        # level-triggered: the same snapshot against the same view plans nothing new
        replay = world.plan(self.snap)
        assert replay.actions == (), replay.actions
        for action in result.actions:
            if not isinstance(action, FailRequest):
                assert action.op_id not in self.op_ids, f"op_id {action.op_id} reused"
                self.op_ids.add(action.op_id)
        self.execute(result.actions, outcome)
        return result.actions

    # --- rules -----------------------------------------------------------------------------------------------

    @rule(demand=demand_st)
    def new_snapshot(self, demand) -> None:
        self.snap = snapshot(self.snap.seq + 1, *demand)

    @rule(outcome=st.sampled_from(OUTCOMES))
    def reconcile(self, outcome: str) -> None:
        self.reconcile_once(outcome)

    @precondition(lambda self: self.world.state.applied_seq > 0)
    @rule(demand=demand_st)
    def stale_snapshot(self, demand) -> None:
        before = self.world.state
        result = self.world.plan(snapshot(before.applied_seq - 1, *demand))
        assert result.actions == () and result.state is before

    @rule(dt=st.sampled_from([1.0, 30.0, 61.0, 200.0, 301.0, 901.0, 1300.0]))
    def advance(self, dt: float) -> None:
        self.world.now += dt

    @rule(data=st.data())
    def provider_progress(self, data) -> None:
        """A slow request makes progress; a crashed call is recovered."""
        if self.slow:
            op_id = data.draw(st.sampled_from(sorted(self.slow)))
            n = data.draw(st.integers(1, self.slow[op_id]))
            self.slow[op_id] -= n
            if not self.slow[op_id]:
                del self.slow[op_id]
            self.commit_instances(op_id, self.provider.create(op_id, n))
        if self.unknown:
            self.recover(data.draw(st.sampled_from(sorted(self.unknown))))

    @rule(data=st.data(), status=st.sampled_from([HostStatus.JOINED, HostStatus.IDLE, HostStatus.BUSY]))
    def host_changes(self, data, status: HostStatus) -> None:
        world = self.world
        candidates = sorted(m for m in world.active() if m in self.provider.alive)
        if candidates:
            world.host(data.draw(st.sampled_from(candidates)), status)

    @rule(data=st.data())
    def reclaim(self, data) -> None:
        world = self.world
        alive = sorted(self.provider.alive)
        if alive:
            machine_id = data.draw(st.sampled_from(alive))
            self.provider.alive.discard(machine_id)
            record = world.view.machines.get(machine_id)
            if record is not None:
                world.hosts.pop(record.instance_ref, None)
            provider = "p" if any(machine_id in v for k, v in self.provider.created.items() if ":p:" in k) else "q"
            world.state = observe(world.state, Reclaimed(provider, (machine_id,), world.now), POLICY).state

    @rule()
    def converge(self) -> None:
        """Faults stop, demand holds: within a bounded number of rounds the plan is empty and demand is met."""
        world = self.world
        for op_id in sorted(self.unknown):
            self.recover(op_id)
        for op_id, n in sorted(self.slow.items()):
            self.commit_instances(op_id, self.provider.create(op_id, n))
        self.slow.clear()
        # past every back-off window (an unhealthy provider's first step for quota is the longest; the step grows
        # with quota failures in a row, up to unhealthy_max)
        world.now += POLICY.unhealthy_max
        for _ in range(30):
            world.now += 400.0  # past the step interval and idle_time
            for machine_id in world.active():  # workers join, and have been idle long enough to go back
                if machine_id in self.provider.alive:
                    world.host(machine_id, HostStatus.IDLE, since=world.now - POLICY.idle_time)
            if not self.reconcile_once("fulfil"):
                break
        else:
            raise AssertionError("no fixpoint after 30 rounds")
        wanted = sum(i.count for i in self.snap.items)
        assert len(world.active()) == wanted
        assert not world.view.open_ops and not world.in_flight.unseen(world.view)[0].requests

    # --- invariants ------------------------------------------------------------------------------------------

    @invariant()
    def every_created_machine_is_explained(self) -> None:
        view = self.world.view
        for op_id, machine_ids in self.provider.created.items():
            for machine_id in machine_ids:
                assert machine_id in view.machines or view.intents[op_id].open, (op_id, machine_id)

    @invariant()
    def caps_hold(self) -> None:
        view = self.world.view
        load: dict[tuple[str, str], int] = {}
        for m in view.machines.values():
            if m.state in (MachineState.ACTIVE, MachineState.RETURNING):
                load[(m.provider, m.template_id)] = load.get((m.provider, m.template_id), 0) + 1
        for op_id in view.open_ops:
            r = view.intents[op_id]
            key = (r.intent.provider, r.intent.template_id)
            load[key] = load.get(key, 0) + r.outstanding
        for o in OFFERS:
            assert load.get((o.provider, o.template_id), 0) <= o.max_number
        for provider, cap in POLICY.provider_caps.items():
            assert sum(n for (p, _), n in load.items() if p == provider) <= cap

    @invariant()
    def step_limit_holds(self) -> None:
        if self.requests:
            last = self.requests[-1][0]
            window = sum(n for t, n in self.requests if t > last - POLICY.step_interval)
            assert window <= POLICY.step_limit


TestReconcileMachine = ReconcileMachine.TestCase
TestReconcileMachine.settings = fuzz_settings(60, stateful_step_count=40)
