"""The ``store_loss`` fault: the reference controller comes back on an empty store, a new incarnation (term 1 again,
no facts, no hosts, no lease; the scheduler sends its demand again), as after a lost disk or a store restored from
nothing. DESIGN invariant 9 says what the daemons must do, and the recorder checks it:

- every daemon instance that remembers the lost incarnation (its slot's state file says so: at the loss, or when it
  starts later) is *amnesiac* until the admin accepts the reset: a provider mutation it starts meanwhile is
  ``mutation_while_halted``;
- when the admin decides, every machine that ran at the loss still runs, unless a ``vanish`` fault took it or a
  return or stop already named it before the loss: its call, or the ``ReturnIntent`` the lost log acknowledged
  (the ack may reach the daemon after the loss, and it may act on it before it can learn of the loss:
  ``invariants.acked_before_loss``) (``machine_forgotten`` otherwise);
- the admin (the world) accepts the reset on each daemon that reports the amnesia, at the fault's end and then
  whenever another one does (one that was partitioned, or restarted still remembering the old incarnation).

After the reset the machines the lost log explained are the admin's: the orphan policy reports them, and the
convergence check leaves them out: those running at the loss (``forgotten``) and those a request the lost log held
made later, its call still under way at the loss (``lost_ops``: the daemon could not commit their instance facts
to the new store, so they are tagged orphans like the others), unless the new store records them (the daemon ran
that request again after the reset, under the same op_id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from provisionerd.domain.model import TAG_OP, InstanceFact, RequestIntent, ReturnIntent
from provisionerd.testing.simulation.nodes import ObservedCluster
from refcontroller.store import FactStore

if TYPE_CHECKING:
    from provisionerd.testing.simulation.world import World

#: Seconds between two looks of the admin for a daemon that reports the amnesia.
ADMIN_POLL = 1.0


class StoreLosses:
    def __init__(self) -> None:
        #: Controller incarnations lost so far, and their stores (closed at the end of the run).
        self.incarnations: set[str] = set()
        self.stores: list[FactStore] = []
        #: Machines running when a store was lost (machine id -> when): the halted daemons must keep them.
        self.forgotten: dict[str, float] = {}
        #: Request op ids the lost stores held: machines they make after the loss are explained by a lost log too.
        self.lost_ops: set[str] = set()
        #: Machines a ``ReturnIntent`` of a lost store named (their return was acknowledged before the loss).
        self.returning: set[str] = set()
        self.resets_accepted = 0

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def lose(self, world: World) -> None:
        """The controller restarts on an empty store; every daemon that remembers the old one must now halt."""
        assert world.cluster is not None
        old, s, server = world.cluster, world.settings, world.server
        self.incarnations.add(old.store.incarnation)
        self.stores.append(old.store)
        now = trio.current_time()
        for machine in world.cloud.running():
            self.forgotten.setdefault(str(machine["machineId"]), now)
        for committed in old.store.all_facts():
            if isinstance(committed.fact, RequestIntent):
                self.lost_ops.add(committed.fact.op_id)
            elif isinstance(committed.fact, ReturnIntent):
                self.returning.update(committed.fact.machine_ids)
        store = FactStore.open(":memory:", incarnation=f"sim-{world.seed}-after-loss-{len(self.stores)}")
        cluster = ObservedCluster.open(store, s.replicas, s.ttl, s.check_interval, now)
        cluster.replicas.addresses = list(world.addresses)
        cluster.recorder = world.recorder
        if old.demand.items:
            cluster.set_demand(old.demand.items)
        world.recorder.new_controller(store.incarnation)
        world.cluster = cluster
        server.cluster = cluster
        for replica in range(s.replicas):
            server.disconnect_replica(replica)
        for node in world.instances:
            memory = world.memories.get(node.slot)
            remembers = memory is not None and memory.load().incarnation == old.store.incarnation
            if remembers and not node.scope.cancel_called:
                world.recorder.amnesia(node.instance, True)

    def explained(self, machine: dict[str, Any], current: FactStore | None = None) -> bool:
        """Whether a lost log explained ``machine``: running at a loss, or made by a request that log held and not
        recorded in the ``current`` log since (a daemon whose call's outcome was unknown may commit that request's
        intent again after the reset and make its machines under the same op_id: then they are its own; seed
        470068049)."""
        machine_id = str(machine["machineId"])
        if machine_id in self.forgotten:
            return True
        if machine["tags"].get(TAG_OP) not in self.lost_ops:
            return False
        if current is None:
            return True
        return not any(
            isinstance(c.fact, InstanceFact) and c.fact.machine_id == machine_id for c in current.all_facts()
        )

    def check_kept(self, world: World) -> None:
        """When the admin decides: every machine running at the loss still runs (see the module docstring)."""
        cloud = world.cloud
        for machine_id, lost_at in sorted(self.forgotten.items()):
            doc = cloud.machines[machine_id]
            named = cloud.named_by_mutation.get(machine_id)
            under_way = (named is not None and named <= lost_at) or machine_id in self.returning
            if doc["status"] == "running" or machine_id in cloud.vanished or under_way:
                continue
            world.recorder.violate(
                "machine_forgotten",
                f"machine {machine_id}, running when the controller lost its store at {lost_at:.3f}, is"
                f" {doc['status']} before the admin accepted the reset",
            )

    async def accept_resets(self, world: World) -> None:
        """The admin accepts the reset on every amnesiac daemon that reports the amnesia, now and later."""
        rec = world.recorder
        while trio.current_time() < world.end_time:
            for node in world.instances:
                if node.scope.cancel_called or node.instance not in rec.amnesiac:
                    continue
                if node.core.guard.finding is not None:
                    answer = node.core.guard.accept_reset("sim-admin")
                    self.resets_accepted += 1
                    rec.note(node.instance, "reset_accepted", ok=answer.get("ok"))
                    rec.amnesia(node.instance, False)
            await trio.sleep(ADMIN_POLL)
