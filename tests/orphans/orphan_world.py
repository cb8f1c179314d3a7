"""Scenario builders for the orphan classifier tests: a small world of facts, a listing and hosts."""

from __future__ import annotations

import attrs

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    CommittedFact,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    ProviderMachine,
    RequestIntent,
)
from provisionerd.orphans.classify import (
    ClassifierMemory,
    ControllerState,
    CountedResource,
    LeaseState,
    Observation,
    OrphanPolicy,
    classify,
)
from provisionerd.planner.fact_view import fold

CLUSTER = "clu-1"
PROVIDER = "sim"
NOW = 1_700_000_000.0
EPOCH = Epoch(4, 2)
OLD = NOW - 4000.0  # older than both the join deadline (900) and the grace (1800)
YOUNG = NOW - 60.0


def owner_tags(op: str = "op-unknown", instance: str = "", **extra: str) -> dict[str, str]:
    tags = {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: PROVIDER, TAG_OP: op, TAG_EPOCH: "4.1"}
    if instance:
        tags[TAG_INSTANCE] = instance
    tags.update(extra)
    return tags


@attrs.define
class World:
    """Accumulates facts, listed machines, hosts and grants; ``observe()`` freezes them into an Observation."""

    facts: list = attrs.field(factory=list)
    listing: list = attrs.field(factory=list)
    hosts: list = attrs.field(factory=list)
    licenses: list = attrs.field(factory=list)

    def fact(self, fact) -> World:
        self.facts.append(CommittedFact(len(self.facts) + 1, fact))
        return self

    def intent(self, op_id: str, count: int = 1, provider: str = PROVIDER) -> World:
        refs = tuple(f"{op_id}-ref{i}" for i in range(count))
        return self.fact(RequestIntent(provider, EPOCH, op_id, "tmpl", count, refs, ("0" * 64,) * count))

    def instance(
        self, machine_id: str, op_id: str, launch: float = OLD, hostname: str = "", address: str = ""
    ) -> World:
        self.intent(op_id)
        return self.fact(
            InstanceFact(
                PROVIDER, EPOCH, op_id, f"{op_id}-ref0", machine_id, "tmpl", "0" * 64, hostname, address, launch
            )
        )

    def listed(
        self,
        machine_id: str,
        launch: float = OLD,
        tags: dict | None = None,
        name: str = "",
        address: str = "",
        status: str = "running",
        instance_ref: str = "",
    ) -> World:
        tags = owner_tags() if tags is None else tags
        self.listing.append(ProviderMachine(machine_id, name, "succeed", status, launch, address, instance_ref, tags))
        return self

    def host(
        self,
        instance_ref: str = "",
        machine_id: str = "",
        hostname: str = "",
        address: str = "",
        status: HostStatus = HostStatus.IDLE,
    ) -> World:
        self.hosts.append(HostState(instance_ref, PROVIDER, machine_id, status, NOW - 10, hostname, address))
        return self

    def grant(
        self, resource: str, granted: int, in_use: int | None, agrees: bool, checked_out: float = NOW - 3600
    ) -> World:
        self.licenses.append(CountedResource(resource, granted, in_use, agrees, checked_out=checked_out))
        return self

    def observe(self, **changes) -> Observation:
        obs = Observation(
            cluster_id=CLUSTER,
            provider=PROVIDER,
            now=NOW,
            listing=tuple(self.listing),
            view=fold(self.facts),
            hosts=tuple(self.hosts),
            licenses=tuple(self.licenses),
            lease=LeaseState(True, EPOCH),
            controller=ControllerState(primary=True, settled=True),
        )
        return attrs.evolve(obs, **changes)


def run(obs: Observation, policy: OrphanPolicy | None = None, memory: ClassifierMemory | None = None):
    return classify(obs, policy or OrphanPolicy(), memory)


def only(result, machine_id: str):
    """The single finding for ``machine_id``."""
    found = [f for f in result.findings if f.machine_id == machine_id]
    assert len(found) == 1, result.findings
    return found[0]
