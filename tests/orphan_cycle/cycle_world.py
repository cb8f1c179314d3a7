"""A small world for the orphan cycle's tests: an in-memory provider, facts, hosts, a lease, a fake executor.

Everything runs on trio's clock (``MockClock`` in the tests); the wall clock of launch times is ``NOW`` plus the
virtual time elapsed, so machines age as the test sleeps.
"""

from __future__ import annotations

import collections
import hashlib

import attrs
import trio

from provisionerd.domain.errors import LeaseError
from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    CommittedFact,
    Epoch,
    HostState,
    InstanceFact,
    RequestFailed,
    RequestIntent,
)
from provisionerd.execution.executor import ReturnOutcome
from provisionerd.execution.orphan_cycle import OrphanCycle
from provisionerd.execution.orphan_reads import ControllerRead
from provisionerd.orphans.model import ControllerState, LeaseState, Unreadable
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.planner.fact_view import fold
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

CLUSTER = "clu"
PROVIDER = "sim"
NOW = 1_700_000_000.0
OLD = int(NOW - 4000)  # past the join deadline (900) and the grace (1800)
EPOCH = Epoch(3, 7)


def tags(op: str = "op-stray", **extra: str) -> dict[str, str]:
    return {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: PROVIDER, TAG_OP: op, TAG_EPOCH: "3.1", **extra}


class FakeExecutor:
    """Records what the cycle asks for. Returns go to the fake provider (so its call log shows them) unless a
    status is queued in ``statuses``; facts are stamped with the lease epoch held *now*, like the real one."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.returns: list[dict] = []
        self.facts: list = []  # as committed (stamped)
        self.planned_epochs: list[Epoch] = []  # the epoch on each fact as the cycle handed it over
        self.statuses: collections.deque[str] = collections.deque()
        self.commit_errors: collections.deque[Exception] = collections.deque()

    async def return_machines(self, provider, op_id, machine_ids, reason, *, stop=False) -> ReturnOutcome:
        await trio.sleep(2.0)  # a gate round trip and a provider call take time
        lease = self.world.lease
        if not lease.usable:
            return ReturnOutcome(op_id, provider, "dropped", code="LeaseError")
        self.returns.append(
            {
                "provider": provider,
                "op_id": op_id,
                "machine_ids": tuple(machine_ids),
                "reason": reason,
                "stop": stop,
                "epoch": lease.epoch,
            }
        )
        status = self.statuses.popleft() if self.statuses else "returned"
        if status != "returned":
            return ReturnOutcome(op_id, provider, status, code="provider_error", detail="simulated failure")
        await self.world.provider.call(
            "requestReturnMachines",
            {
                "machines": [{"name": "", "machineId": m} for m in machine_ids],
                "op_id": op_id,
                "tags": {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: provider, TAG_OP: op_id, TAG_EPOCH: str(lease.epoch)},
            },
        )
        return ReturnOutcome(op_id, provider, "returned", tuple(machine_ids))

    async def commit_fact(self, fact) -> int:
        await trio.sleep(0.5)
        if self.commit_errors:
            raise self.commit_errors.popleft()
        lease = self.world.lease
        if not lease.usable:
            raise LeaseError(fact.provider, "not held")
        self.planned_epochs.append(fact.epoch)
        stamped = attrs.evolve(fact, epoch=lease.epoch)
        self.facts.append(stamped)
        self.world.add(stamped)
        return len(self.world.facts)


@attrs.define
class World:
    provider: FakeProvider = attrs.field(factory=lambda: FakeProvider(PROVIDER, launch_time=OLD))
    facts: list = attrs.field(factory=list)
    hosts: list[HostState] = attrs.field(factory=list)
    lease: LeaseState = LeaseState(True, EPOCH)
    controller: ControllerState = ControllerState(primary=True, settled=True)
    view_down: str = ""  # a reason: the controller's view is unreadable
    events: EventLog = attrs.field(factory=EventLog)
    reads: list[str] = attrs.field(factory=list)  # "listing"/"licenses"/"view" in the order the cycle read them

    def add(self, fact) -> World:
        self.facts.append(CommittedFact(len(self.facts) + 1, fact))
        return self

    def machine(self, machine_id: str, machine_tags: dict[str, str], launch: int = OLD, name: str = "") -> World:
        """A running machine in the provider, as its own listing would show it."""
        n = len(self.provider.machines) + 1
        self.provider.machines[machine_id] = {
            "machineId": machine_id,
            "name": name or f"host-{machine_id}",
            "status": "running",
            "template": "small",
            "launchtime": launch,
            "privateIpAddress": f"10.1.0.{n}",
            "instanceRef": machine_tags.get(TAG_INSTANCE, ""),
            "tags": dict(machine_tags),
        }
        return self

    def instance(self, machine_id: str, op_id: str, launch: float = OLD) -> World:
        """A request intent and the instance fact of one machine."""
        ref = f"{CLUSTER}/{op_id}/0"
        digest = hashlib.sha256(op_id.encode()).hexdigest()
        self.add(RequestIntent(PROVIDER, EPOCH, op_id, "small", 1, (ref,), (digest,)))
        return self.add(InstanceFact(PROVIDER, EPOCH, op_id, ref, machine_id, "small", digest, launch_time=launch))

    def intent_only(self, op_id: str, failed: bool = True) -> World:
        """A request intent with no instance fact, written off (``RequestFailed``) unless ``failed`` is false."""
        ref = f"{CLUSTER}/{op_id}/0"
        self.add(RequestIntent(PROVIDER, EPOCH, op_id, "small", 1, (ref,), ("0" * 64,)))
        return self.add(RequestFailed(PROVIDER, EPOCH, op_id, "timed out")) if failed else self

    def read_controller(self) -> ControllerRead:
        self.reads.append("view")
        if self.view_down:
            return ControllerRead(Unreadable(self.view_down))
        return ControllerRead(fold(self.facts), tuple(self.hosts), self.controller)

    def cycle(
        self, policy: OrphanPolicy | None = None, executor: FakeExecutor | None = None, fleet_floor: int = 0
    ) -> OrphanCycle:
        executor = executor if executor is not None else FakeExecutor(self)
        world = self

        class Listing:  # records the order of reads: the listing must come first
            name = PROVIDER

            async def call(self, action, input, *, timeout=None):
                read = {"listMachines": "listing", "listLicenses": "licenses"}.get(action)
                if read is not None:  # describeProvider (the licence feature, asked once) reads no state
                    world.reads.append(read)
                return await world.provider.call(action, input, timeout=timeout)

            async def aclose(self):
                pass

        cycle = OrphanCycle(
            cluster=CLUSTER,
            identity="prov-1",
            provider=PROVIDER,
            policy=policy or OrphanPolicy(),
            client=PluginClient(Listing()),
            read_controller=self.read_controller,
            read_lease=lambda: self.lease,
            executor=executor,
            events=self.events,
            wall_clock=lambda: NOW + trio.current_time(),
            fleet_floor=fleet_floor,
        )
        cycle.fake_executor = executor  # type: ignore[attr-defined]
        return cycle

    def kinds(self, *names: str) -> list[dict]:
        return list(self.events.of_kind(*names))

    def provider_actions(self) -> list[str]:
        """The actions asked of the provider, but ``describeProvider`` (read once, for the licence feature: see
        ``tests/orphan_cycle/test_licences.py``)."""
        return [action for action, _ in self.provider.calls if action != "describeProvider"]
