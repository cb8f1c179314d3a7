"""The ``reload`` fault: a config reload (SIGHUP) while an admin orphan action is under way (issue 15, items 2 and 7).

At the fault's time one slot's daemon gets an ``orphan_action`` request through the guarded command its admin
socket runs (``core.admin.guard("orphan_action", core.orphan_actions.command)``, bounded by the command's own
timeout like the socket: past it the answer is ``pending``): a dry-run adopt of a running machine, a real adopt of
it, or an adopt or a return of a machine id that does not exist (``Fault.admin``). Once the action is under way (its
listing is out), ``DaemonCore.reload(new)`` is called with a mutated config (``Fault.mode``):

``cap_down``   live: the provider's ``max_machines`` lowered to ``Fault.value`` (0 included)
``idle_time``  live: the provider's ``idle_time`` set to ``Fault.value`` seconds
``rename``     needs a restart: the provider renamed (the case that crashed the daemon in issue 15)
``addresses``  needs a restart: a controller address added

Then a second admin request (a dry run) is sent under the reloaded daemon. At the fault's end a live change is
undone by a second live reload back to the original config (which raises the cap again), so the lifecycle's
convergence check still holds.

The simulated daemons plan with a fixed policy (``lifecycle.core_options``: short times) rather than one derived
from the config, so a live change sets the same knob in that policy too, in the same switch (the holder derives the
policy at the reload from the fixed one; a reload that does not apply puts the old one back).

Checked (``invariants``): ``reload_raised`` (the reload or the guarded command raised out), ``admin_unanswered``
(no answer, or one neither ok nor a typed refusal: ``internal_error`` is the daemon's own bug report),
``reload_half_applied`` (a restart-needing reload changed the running config, policy or orphan policy),
``reload_not_live`` (a live reload did not install the new config and knob at once, or, in lifecycle runs, the
reloaded daemon requested machines the new cap does not allow in an action planned after the reload: the live
machines in the controller's log plus the request beyond ``max_machines``; machines above a lowered cap that were
already running or requested are no violation, only a new request beyond it). A daemon task that dies of an
exception is ``daemon_crashed`` as always.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from provisionerd.config.loader import Config
from provisionerd.planner.policy import Policy
from provisionerd.testing.simulation import invariants

if TYPE_CHECKING:
    from provisionerd.testing.simulation.faults import Fault
    from provisionerd.testing.simulation.nodes import DaemonNode
    from provisionerd.testing.simulation.observe import Mutation
    from provisionerd.testing.simulation.world import World

LIVE = ("cap_down", "idle_time")
RESTART = ("rename", "addresses")
CHANGES = (*LIVE, *RESTART)
ADMIN_ACTIONS = ("adopt_dry", "adopt", "adopt_missing", "return_missing")
MISSING = "i-no-such-machine"


def mutated(config: Config, mode: str, value: float) -> Config:
    """``config`` with the fault's change (module docstring)."""
    provider = config.providers[0]
    match mode:
        case "cap_down":
            provider = attrs.evolve(provider, max_machines=int(value))
        case "idle_time":
            provider = attrs.evolve(provider, idle_time=value)
        case "rename":
            provider = attrs.evolve(provider, name=f"{provider.name}-renamed")
        case "addresses":
            controller = attrs.evolve(config.controller, addresses=(*config.controller.addresses, "ctl-new:7400"))
            return attrs.evolve(config, controller=controller)
    return attrs.evolve(config, providers=(provider, *config.providers[1:]))


def mutated_policy(policy: Policy, provider: str, mode: str, value: float) -> Policy:
    """The fixed planner policy with the same live change (the simulation's daemons plan with one)."""
    if mode == "cap_down":
        if provider in policy.providers:
            own = attrs.evolve(policy.providers[provider], max_machines=int(value))
            return attrs.evolve(policy, providers={**policy.providers, provider: own})
        return attrs.evolve(policy, provider_caps={**policy.provider_caps, provider: int(value)})
    if mode == "idle_time":
        return attrs.evolve(policy, idle_time=value)
    return policy


@attrs.define(eq=False)
class Reloaded:
    """One live reload in force on one daemon instance: the cap it set and the ops planned before it."""

    instance: str
    provider: str
    cap: int | None
    before: frozenset[str]
    checked: set[str] = attrs.field(factory=set)
    open: bool = True


class ReloadFaults:
    def __init__(self) -> None:
        self.done = 0  # reload faults carried out (a killed slot's is skipped)
        self.under_way = 0  # ... of which the admin action was under way at the reload (not refused at once)
        self.outcomes: list[str] = []
        self.live: list[Reloaded] = []
        self._undo: dict[int, tuple[DaemonNode, Config, Any, Reloaded]] = {}

    # --- the fault ---------------------------------------------------------------------------------------------

    async def begin(self, world: World, fault: Fault) -> None:
        node = world.nodes.get(fault.slot)
        if node is None or node.scope.cancel_called:
            world.recorder.note("faults", "reload_skipped", slot=fault.slot)
            return
        core, rec = node.core, world.recorder
        provider = core.config.providers[0].name
        request = self._request(world, provider, fault.admin)
        answers: list[dict[str, Any] | None] = []
        async with trio.open_nursery() as nursery:
            # Started just before the request runs: it has no checkpoint until its action is under way (in
            # ``orphan_actions.running``, its listing out) or refused, so this reload comes while it is in progress.
            await nursery.start(self._admin, world, node, request, answers)
            if node.scope.cancel_called:
                return
            self.done += 1
            self.under_way += (provider, request["machine"]) in core.orphan_actions.running
            self._reload(world, node, fault, provider)
        invariants.check_admin_answer(rec, node.instance, request, answers[0] if answers else None)
        if node.scope.cancel_called:
            return
        after = {**request, "dry_run": True, "action": "adopt"}
        answers.clear()
        await self._admin(world, node, after, answers)
        invariants.check_admin_answer(rec, node.instance, after, answers[0] if answers else None)

    def end(self, world: World, fault: Fault) -> None:
        """Undo a live change: a live reload back to the original config (the cap goes up again)."""
        undo = self._undo.pop(id(fault), None)
        if undo is None:
            return
        node, original, policy, window = undo
        window.open = False
        if node.scope.cancel_called:
            return
        node.core.current._fixed_policy = policy
        try:
            result = node.core.reload(original)
        except Exception as exc:  # noqa: BLE001 - the invariant: a reload never raises
            world.recorder.violate("reload_raised", f"{node.instance}: undo: {type(exc).__name__}: {exc}"[:300])
            return
        world.recorder.note(node.instance, "reload_undone", outcome=result.outcome)
        if result.outcome != "applied" or node.core.config != original:
            world.recorder.violate(
                "reload_not_live", f"{node.instance}: the reload back to the original config was {result.outcome}"
            )

    # --- its parts -----------------------------------------------------------------------------------------------

    def _request(self, world: World, provider: str, admin: str) -> dict[str, Any]:
        running = [str(m["machineId"]) for m in world.cloud.running()]
        existing = running[0] if running else MISSING
        kind = "return" if admin == "return_missing" else "adopt"
        machine = MISSING if admin.endswith("_missing") else existing
        return {
            "cmd": "orphan_action",
            "action": kind,
            "provider": provider,
            "machine": machine,
            "user": "sim-admin",
            "dry_run": admin == "adopt_dry",
        }

    async def _admin(
        self,
        world: World,
        node: DaemonNode,
        request: dict[str, Any],
        answers: list[dict[str, Any] | None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The request as the admin socket runs it: the guarded command, bounded by its own timeout."""
        core = node.core
        command = core.admin.guard("orphan_action", core.orphan_actions.command)
        try:
            answer: dict[str, Any] = {"ok": False, "pending": True}
            with trio.move_on_after(command.timeout(request)):
                task_status.started()
                answer = await command.run(request, None)
        except Exception as exc:  # noqa: BLE001 - the invariant: nothing raises out of the guard
            world.recorder.violate("reload_raised", f"{node.instance}: orphan_action raised {type(exc).__name__}")
            answers.append({"ok": False, "raised": type(exc).__name__})
            return
        world.recorder.note(
            node.instance,
            "admin_answer",
            ok=answer.get("ok"),
            refused=answer.get("refused"),
            said=str((answer.get("result") or {}).get("message", answer.get("error", "")))[:120],
        )
        answers.append(answer)

    def _reload(self, world: World, node: DaemonNode, fault: Fault, provider: str) -> None:
        core, rec = node.core, world.recorder
        before_config, before_policy = core.config, core.policy
        before_orphan = core.current.orphan_policy(provider)
        new = mutated(before_config, fault.mode, fault.value)
        fixed = core.current._fixed_policy
        if fixed is not None:
            core.current._fixed_policy = mutated_policy(fixed, provider, fault.mode, fault.value)
        planned = set(core.executor.busy_ops) | set(core.loop.operations.in_flight().requests)
        planned |= {op for kind, op in rec.commits_by_op if kind == "RequestIntent"}
        try:
            result = core.reload(new)
        except Exception as exc:  # noqa: BLE001 - the invariant: a reload never raises
            rec.violate("reload_raised", f"{node.instance}: reload ({fault.mode}): {type(exc).__name__}: {exc}"[:300])
            core.current._fixed_policy = fixed
            return
        rec.note(node.instance, "reloaded", mode=fault.mode, outcome=result.outcome)
        self.outcomes.append(result.outcome)
        if result.outcome != "applied":
            core.current._fixed_policy = fixed
        if fault.mode in RESTART:
            invariants.check_restart_reload(
                rec,
                node.instance,
                result.outcome,
                unchanged=core.config is before_config
                and core.policy is before_policy
                and core.current.orphan_policy(provider) is before_orphan,
            )
            return
        cap = int(fault.value) if fault.mode == "cap_down" else None
        in_force = core.loop.policy.of(provider)
        invariants.check_live_reload(
            rec,
            node.instance,
            result.outcome,
            installed=core.config == new and (cap is None or in_force.max_machines == cap),
        )
        window = Reloaded(node.instance, provider, cap, frozenset(planned))
        self._undo[id(fault)] = (node, before_config, fixed, window)
        if cap is not None and world.lifecycle:
            self.live.append(window)
            rec.on_mutation.append(lambda m: self._watch(world, window, m))

    def _watch(self, world: World, window: Reloaded, mutation: Mutation) -> None:
        """A request planned after the live reload, by the reloaded instance, while it is in force: within the cap."""
        if not window.open or mutation.action != "requestMachines" or mutation.caller.instance != window.instance:
            return
        if mutation.op_id in window.before or mutation.op_id in window.checked or window.cap is None:
            return
        window.checked.add(mutation.op_id)
        assert world.cluster is not None
        invariants.check_request_within_cap(
            world.recorder, mutation, window.cap, world.cluster.store.all_facts(), window.provider
        )
