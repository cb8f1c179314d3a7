"""The daemon's own provisioning lifecycle in the simulation: demand that changes, workers that boot and join, and
the convergence check.

In ``lifecycle`` runs the daemons run exactly what ``DaemonCore`` wires (offer feed, reconcile loop, executor, all
through the mutation gate) against the simulated cloud. The world drives it from outside, as a cluster would:

- **demand**: a level (``count`` machines of one shape) set on the controller at seeded times and pushed;
- **workers**: each machine the cloud creates boots for a seeded while and then joins the controller with the join
  token from its bootstrap (the controller admits it by the token hash the daemon committed) and reports idle;
  during a ``no_join`` fault window new machines never join (the daemon must return them after its join deadline);
  a machine that vanishes is reported lost.
- **convergence**: once the faults are over and the world has settled, the provider must run exactly the machines
  the last demand asks for, within the capacity and the provider cap (``no_convergence`` otherwise).

Short policy times (join deadline, idle time, back-offs) keep a run to minutes of virtual time.
"""

from __future__ import annotations

import inspect
import math
import random
from typing import TYPE_CHECKING, Any

import attrs
import trio

from provisionerd.domain.model import TAG_CLUSTER, DemandItem, HostState, HostStatus, ResourceShape
from refcontroller.credentials import new_credential

if TYPE_CHECKING:
    from provisionerd.testing.simulation.world import World

CLUSTER = "simcluster"
DEMAND_ID = "sim-demand"
#: Seconds between an admin's or a worker's tries while the controller answers ``storage_failure``.
STORAGE_RETRY = 2.0


def available() -> bool:
    """True when ``DaemonCore`` wires the lifecycle (it accepts injected provider clients)."""
    try:
        from provisionerd.daemon.root import DaemonCore
    except ImportError:
        return False
    return "providers" in inspect.signature(DaemonCore).parameters


def core_options(world: World) -> dict[str, Any]:
    """``DaemonCore`` keyword arguments for a simulated daemon: short policy times, quick loops."""
    from provisionerd.execution.executor import ExecutorSettings
    from provisionerd.execution.loop import LoopSettings
    from provisionerd.planner.headroom import Headroom
    from provisionerd.planner.policy import Policy, ProviderPolicy

    s = world.settings
    # The provider's own knobs, as the daemon builds them from its config (``policy_from_config``): its own
    # ``step_limit`` makes its step adaptive (``planner.ramp``), so the faults' throttles and capacity refusals
    # halve it and accepted rounds double it from 2 up to the provider's cap (4, 8 or 20).
    times: dict[str, Any] = {  # the policy times the daemon and its provider share
        "join_deadline": 60.0,
        # Workers rejoin a restarted controller within 40 s here (``Workers.controller_restarted``): the window
        # after a (re)join is scaled like the other times (production: 120 s for a 900 s join deadline).
        "rejoin_settle": 60.0,
        "idle_time": 30.0,
        "provisioning_timeout": 120.0,
        "capacity_backoff": 20.0,
        "throttle_base": 2.0,
        "throttle_max": 20.0,
        "quota_pause": 30.0,
        # Scaled like the rest (production: 1800 s): the longest wait for a probe of an unhealthy provider stays
        # well inside the settle time after the last fault (seed 918275638: a 4th quota failure put the probe
        # 240 s later, past the 200 s settle, with the default).
        "unhealthy_max": 60.0,
    }
    spare: dict[str, int] = {"spare": 1} if s.priority_split else {}  # WorldSettings.priority_split
    own = ProviderPolicy(
        **times,
        step_limit=2,
        max_machines=s.provider_cap,
        max_ncpus=s.cpu_limit or None,
        template_priority=spare,
    )
    policy = Policy(
        cluster=CLUSTER,
        **times,
        step_limit=20,
        step_interval=30.0,
        providers={"sim": own},
        headroom=(Headroom("sim", "small", s.headroom),) if s.headroom else (),
    )
    return {
        "policy": policy,
        "loop_settings": LoopSettings(replan_interval=5.0, recover_after=15.0, reclaim_interval=30.0),
        "executor_settings": ExecutorSettings(
            cluster=CLUSTER, controllers=world.addresses, provisioning_timeout=120.0, return_timeout=120.0
        ),
        "offer_interval": 30.0,
    }


@attrs.frozen
class DemandStep:
    at: float
    count: int


def draw_demand(rng: random.Random, horizon: float) -> tuple[DemandStep, ...]:
    steps = [DemandStep(0.0, rng.randint(0, 6))]
    for at in sorted(round(rng.uniform(10.0, horizon), 3) for _ in range(rng.randint(0, 4))):
        steps.append(DemandStep(at, rng.randint(0, 8)))
    return tuple(steps)


def demand_items(count: int, all_or_nothing: bool = False) -> list[DemandItem]:
    item = DemandItem(demand_id=DEMAND_ID, shape=ResourceShape(ncpus=1), count=count, all_or_nothing=all_or_nothing)
    return [item] if count else []


class Workers:
    """The machines' side: boot, join with the bootstrap token, report idle; or never join; or vanish."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.no_join = False  # set during a ``no_join`` fault window
        self.bad = False  # set during a ``bad_machines`` window: new machines report 1 CPU (their template: 2)
        self.joined: set[str] = set()
        #: Each joined worker's current credential (what a real agent keeps to rejoin after a controller restart).
        self.credentials: dict[str, str] = {}
        #: Workers with a rejoin under way (one agent process per machine: never two rejoins at once).
        self._rejoining: set[str] = set()
        #: Workers whose machine falls short of its template (a ``bad_machines`` window made them).
        self._bad: set[str] = set()

    def _reported(self, admitted: HostState) -> HostState:
        """``admitted`` with its Join's capability report, as the controller keeps it (refcontroller.server): what
        the template declares, or, for a bad machine, one CPU less than it."""
        assert self.world.cluster is not None
        report = self.world.cloud.report()
        if admitted.instance_ref in self._bad:
            report["ncpus"] = "1"
        return self.world.cluster.hosts.report(admitted.instance_ref, report) or admitted

    def created(self, machine_id: str, instance_ref: str, token: str) -> None:
        if self.no_join:
            self.world.recorder.note("worker", "never_joins", machine=machine_id)
            return
        assert self.world._nursery is not None
        delay = self.rng.uniform(3.0, 30.0)
        self.world._nursery.start_soon(self._boot, machine_id, instance_ref, token, delay, self.bad)

    async def _boot(self, machine_id: str, instance_ref: str, token: str, delay: float, bad: bool = False) -> None:
        await trio.sleep(delay)
        while True:
            cluster, server = self.world.cluster, self.world.server
            if cluster is None or self.world.cloud.machines[machine_id]["status"] != "running":
                return
            wall = self.world.wall()
            credential = new_credential()
            admitted = cluster.admit_worker(cluster.replicas.primary, instance_ref, token, wall, credential=credential)
            if isinstance(admitted, HostState) or admitted.reason != "storage_failure":
                break
            await trio.sleep(STORAGE_RETRY)  # the token use could not be recorded: the agent tries again
        if not isinstance(admitted, HostState):
            self.world.recorder.note("worker", "refused", machine=machine_id, reason=admitted.reason)
            return
        if bad:
            self._bad.add(instance_ref)
        admitted = self._reported(admitted)
        self.joined.add(instance_ref)
        self.credentials[instance_ref] = credential
        self.world.recorder.note("worker", "joined", machine=machine_id, instance=instance_ref, bad=bad)
        server.broadcast_host(admitted)
        idle = cluster.worker_status(instance_ref, HostStatus.IDLE, wall)
        if idle is not None:
            server.broadcast_host(idle)

    def controller_restarted(self) -> None:
        """The controller came back with an empty host table: every joined worker still running rejoins with its
        credential after a delay of its own (agents notice the dropped session and back off)."""
        assert self.world._nursery is not None
        for machine_id, machine in sorted(self.world.cloud.machines.items()):
            ref = machine.get("instanceRef", "")
            if ref in self.credentials and machine["status"] == "running" and ref not in self._rejoining:
                self._rejoining.add(ref)
                self.world._nursery.start_soon(self._rejoin, machine_id, ref, self.rng.uniform(1.0, 40.0))

    def agents_restarted(self, share: float) -> None:
        """``share`` of the joined workers still running have their agent restarted by the machine's init system:
        each rejoins 0.5-10 s later (within the controller's heartbeat timeout, so its host is not lost meanwhile)
        with the credential its state file kept. A refusal of a machine the daemon has not returned is a
        violation: the restarted agent would never join again."""
        assert self.world._nursery is not None
        for machine_id, machine in sorted(self.world.cloud.machines.items()):
            ref = machine.get("instanceRef", "")
            if ref in self.credentials and machine["status"] == "running" and self.rng.random() < share:
                if ref in self._rejoining:
                    continue
                self._rejoining.add(ref)
                self.world.recorder.note("worker", "agent_restarted", machine=machine_id)
                delay = self.rng.uniform(0.5, 10.0)
                self.world._nursery.start_soon(self._rejoin, machine_id, ref, delay, True)

    async def _rejoin(self, machine_id: str, instance_ref: str, delay: float, restarted: bool = False) -> None:
        try:
            await self._rejoin_once(machine_id, instance_ref, delay, restarted)
        finally:
            self._rejoining.discard(instance_ref)

    async def _rejoin_once(self, machine_id: str, instance_ref: str, delay: float, restarted: bool) -> None:
        await trio.sleep(delay)
        while True:
            cluster, server = self.world.cluster, self.world.server
            if cluster is None or self.world.cloud.machines[machine_id]["status"] != "running":
                return
            wall = self.world.wall()
            # A join with a credential is issued none (refcontroller.server): the worker keeps the one it has.
            admitted = cluster.admit_worker(
                cluster.replicas.primary, instance_ref, self.credentials[instance_ref], wall
            )
            if isinstance(admitted, HostState) or admitted.reason != "storage_failure":
                break
            await trio.sleep(STORAGE_RETRY)
        if not isinstance(admitted, HostState):
            self.world.recorder.note("worker", "rejoin_refused", machine=machine_id, reason=admitted.reason)
            explained = self.world.losses.explained(self.world.cloud.machines[machine_id], cluster.store)  # lost
            if restarted and not _ended(admitted.detail) and not explained:
                self.world.recorder.violate(
                    "agent_rejoin_refused",
                    f"machine {machine_id}'s restarted agent was refused: {admitted.reason} {admitted.detail}"[:300],
                )
            return
        self.world.recorder.note("worker", "rejoined", machine=machine_id, instance=instance_ref)
        admitted = self._reported(admitted)
        server.broadcast_host(admitted)
        idle = cluster.worker_status(instance_ref, HostStatus.IDLE, wall)
        if idle is not None:
            server.broadcast_host(idle)

    def vanished(self, machine_id: str, instance_ref: str) -> None:
        if self.world.cluster is None or instance_ref not in self.joined:
            return
        host = self.world.cluster.worker_lost(instance_ref, self.world.wall())
        if host is not None:
            self.world.server.broadcast_host(host)


def _ended(detail: str) -> bool:
    """Whether a refusal says the machine is over (returned, ended or lost): no agent of it may join again."""
    return "ended" in detail or "is lost" in detail


async def drive_demand(world: World, steps: tuple[DemandStep, ...]) -> None:
    """Set each step's demand at its time; one the controller refuses (a storage failure) is sent again every
    ``STORAGE_RETRY`` seconds until it is taken or the next step is due, as a scheduler would."""
    for i, step in enumerate(steps):
        await trio.sleep_until(step.at)
        next_at = steps[i + 1].at if i + 1 < len(steps) else math.inf
        while True:
            assert world.cluster is not None
            try:
                changed = world.cluster.set_demand(demand_items(step.count, world.settings.all_or_nothing))
            except ValueError as exc:
                world.recorder.note("demand", "refused", count=step.count, detail=str(exc)[:120])
                if trio.current_time() + STORAGE_RETRY >= next_at:
                    break
                await trio.sleep(STORAGE_RETRY)
                continue
            if changed is not None:
                world.server.broadcast_demand()
            world.recorder.note("demand", "set", count=step.count)
            break


def check_convergence(world: World, steps: tuple[DemandStep, ...]) -> None:
    """After the faults and the settle time: the provider runs exactly the wanted machines (within caps), all
    joined. An all-or-nothing item the caps cannot hold whole keeps what it had (level-triggered: machines that serve
    it are not returned) and gets nothing more, so any count up to the caps is converged."""
    s = world.settings
    # Warm headroom adds its machines above the demand; the CPU limit (2 a machine) and the caps bound both.
    cpu_room = s.cpu_limit // 2 if s.cpu_limit else s.provider_cap
    room = min(s.capacity + s.priority_split, s.provider_cap, cpu_room)
    wanted = min(steps[-1].count + s.headroom, room)
    fewest = 0 if s.all_or_nothing and steps[-1].count > room else wanted
    # Machines a lost controller store explained are the admin's after the reset (the orphan policy reports them).
    current = None if world.cluster is None else world.cluster.store
    # So are a legacy plugin's machines that the orphan report names (a lost call's, not told apart from another's),
    # and every machine a committed orphan report names: a tagged machine no fact explains (made by a call killed
    # mid-way that landed after recovery failed its op, seed 27300695) is reported at once and returned only after
    # the orphan grace (1800 s), past the settle time; the final check counts it explained the same way.
    reported = world.named_by_report() | {
        c.fact.machine_id for c in world.recorder.commits if c.kind == "OrphanReported"
    }
    ours = [
        m
        for m in world.cloud.running()
        if m["tags"].get(TAG_CLUSTER) == CLUSTER
        and not world.losses.explained(m, current)
        and m["machineId"] not in reported
    ]
    joined = [m for m in ours if m["instanceRef"] in world.workers.joined]
    if not fewest <= len(ours) <= wanted or len(joined) != len(ours):
        world.recorder.violate(
            "no_convergence",
            f"{len(ours)} machines running ({len(joined)} joined) "
            f"{s.settle:g}s after the last fault; demand wants {wanted}",
        )


def check_whole_ops(world: World) -> None:
    """All-or-nothing worlds (issue 35 item 5): ``partial_gang_kept`` when an all-or-nothing request the cloud
    answered in part (it made fewer machines than asked: ``SimCloud.gang_partial``) still has a machine running at
    the end, past the settle time. The daemon must return what such an op made, whatever died meanwhile. Machines a
    lost controller store explained are the admin's (as in the convergence check)."""
    current = None if world.cluster is None else world.cluster.store
    running = {m["machineId"]: m for m in world.cloud.running()}
    for op_id, count in sorted(world.cloud.whole_asked.items()):
        made = [m for creation in world.recorder.creations.get(op_id, ()) for m in creation.machine_ids]
        if not 0 < len(made) < count:
            continue
        kept = [m for m in made if m in running and not world.losses.explained(running[m], current)]
        if kept:
            world.recorder.violate(
                "partial_gang_kept", f"op {op_id}: {len(made)} of {count} made, still running at the end: {kept}"
            )


#: A notice is judged only when no fault came within this many seconds before it or during its span (the effects of
#: an instant fault, such as agents rejoining after a controller restart, last up to 40 s).
NOTICE_CALM = 60.0


async def spot_notice(world: World, at: float, lead: float) -> None:
    """Issue 34 item 4 in the simulation: at ``at`` one joined, running machine's worker reports a spot interruption
    notice for ``lead`` seconds later (``WorkerStatus.reclaimAt``, relayed in its host state), and the cloud takes the
    machine back then. ``notice_ignored`` when it was still unreturned by then though no fault touched the notice's
    span (``NOTICE_CALM`` before it, and the span itself) and a daemon ran throughout."""
    await trio.sleep_until(at)
    cluster, server = world.cluster, world.server
    joined = world.workers.joined
    running = sorted(
        m for m, doc in world.cloud.machines.items() if doc["status"] == "running" and doc.get("instanceRef") in joined
    )
    if cluster is None or not running:
        world.recorder.note("worker", "notice_skipped", reason="no joined machine running")
        return
    machine_id = world.notice_rng.choice(running)
    ref = world.cloud.machines[machine_id]["instanceRef"]
    wall = world.wall()
    host = cluster.worker_status(ref, HostStatus.IDLE, wall, reclaim_at=wall + lead)
    if host is not None:
        server.broadcast_host(host)
    relayed = host is not None
    world.recorder.note("worker", "reclaim_notice", machine=machine_id, reclaim_at=wall + lead, relayed=relayed)
    await trio.sleep(lead)
    returned = machine_id in world.cloud.named_by_mutation
    if world.cloud.machines[machine_id]["status"] == "running":
        world.cloud.reclaim(machine_id)
    if not relayed or not world.calm(at - NOTICE_CALM, at + lead):
        return
    world.recorder.note("worker", "notice_judged", machine=machine_id, returned=returned)
    if not returned:
        world.recorder.violate(
            "notice_ignored", f"{machine_id}: noticed at {at:.3f}, still unreturned when reclaimed {lead:.1f} s later"
        )
