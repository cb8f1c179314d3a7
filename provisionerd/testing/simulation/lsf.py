"""Legacy mode in the simulation: the daemon's real legacy adapter over a simulated LSF one-shot plugin.

Issue 31 item 7 asks for "a daemon kill at every step of a slow one-shot call, legacy mode included". A world whose
``WorldSettings.legacy`` is set gives each daemon start ``LegacyProvider`` (the production adapter, its journal and
its attribution rule) over ``SimLsfRunner``, which stands where ``OneShotProvider`` runs ``<action>.sh`` processes:

- ``SimLsfPlugin`` is the plugin and its cloud, one per world: LSF documents only (no ``op_id``, no tags, its own
  requestIds), machines in the shared ``SimCloud`` (so workers boot and join with the token the operator's userData
  carried), its own record of its requests (``record``: what ``[providers.legacy] state_file`` reads);
- each mutation runs as a task of the *world*, not of the daemon: a daemon killed mid-call leaves it running, as a
  one-shot call survives its daemon in its own session, and the slot's ``SimCallBook`` (its call directories) hands
  it to the slot's next start, which collects its answer (``take_finished`` / ``take_op``) as the real runner does;
- a call that outlives its deadline is killed (``ProviderTimeout``); a caller cancelled while it lives kills its
  call too (the process group), so only a dead daemon leaves one behind;
- the cloud's fault windows apply: ``reject`` (the plugin refuses: a plain LSF message), ``hang`` (no answer until
  the deadline, maybe after acting, maybe after printing its requestId), ``crash`` and ``garbage`` (maybe after
  acting). A lost answer is an unknown outcome the adapter must settle from the plugin's record.

The journal and the calls live in the simulated host's memory (``SimLegacyHost``), across the slot's restarts.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs
import trio

from provisionerd.config.user_data import UserDataTemplate
from provisionerd.domain.errors import (
    ProviderCrashed,
    ProviderError,
    ProviderFailed,
    ProviderProtocolViolation,
    ProviderTimeout,
)
from provisionerd.domain.model import TAG_CLUSTER, TAG_OP
from provisionerd.provider.calls import Collected
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.state_files import PluginMachine, PluginRequest, StateRead
from provisionerd.provider.runtime import ProviderConfig
from provisionerd.testing.simulation.cloud import WALL_EPOCH
from provisionerd.testing.simulation.observe import CallerLease, Creation, Mutation, Recorder

#: The operator's userData: one machine per call, each with its own reference and join token.
USER_DATA = UserDataTemplate({"instance_ref": "{instance_ref}", "join_token": "{join_token}"})
MUTATIONS = frozenset({"requestMachines", "requestReturnMachines"})
#: Where the simulated plugin's record is said to be (``StateRead.where``).
RECORD = "sim-lsf/state.json"


class SimLsfPlugin:
    """The LSF plugin and its cloud: one per world (every daemon start talks to the same one)."""

    def __init__(self, cloud: Any, recorder: Recorder, rng: random.Random, template: str, cluster: str) -> None:
        self.cloud = cloud  # SimCloud: its machines, fault windows and boot hooks
        self.cluster = cluster
        self.recorder = recorder
        self.rng = rng
        self.template = template
        self.requests: dict[str, dict[str, Any]] = {}  # requestId -> {"kind", "machines", "polls"}
        self._seq = itertools.count(1)

    # --- what the plugin does (synchronous: the instant the cloud acts) ----------------------------------------

    def act(self, action: str, document: Mapping[str, Any], op: str, caller: str) -> dict[str, Any]:
        """The plugin's answer to ``document``; ``op`` and ``caller`` are the harness's knowledge only."""
        handler: Callable[[Mapping[str, Any], str, str], dict[str, Any]] = getattr(self, "_" + action)
        return handler(document, op, caller)

    def _getAvailableTemplates(self, document: Mapping[str, Any], op: str, caller: str) -> dict[str, Any]:
        out = self.cloud._getAvailableTemplates({})
        return {"message": "", "templates": out["templates"]}

    def _requestMachines(self, document: Mapping[str, Any], op: str, caller: str) -> dict[str, Any]:
        template = document["template"]
        count = int(template["machineCount"])
        cap = self.cloud.templates.get(template["templateId"])
        if cap is None:
            raise ProviderFailed(self.cloud.name, "requestMachines", f"Template {template['templateId']} unknown")
        live = sum(1 for m in self.cloud.machines.values() if m["status"] == "running")
        if live + count > cap:
            raise ProviderFailed(self.cloud.name, "requestMachines", "Insufficient capacity for the template")
        user_data = document.get("userData") or {}
        request_id = f"lsfreq-{next(self._seq):05d}"
        ids = []
        for _ in range(count):
            n = next(self._seq)
            machine_id = f"lsf-{n:05d}"
            self.cloud.machines[machine_id] = {
                "machineId": machine_id,
                "name": f"lsfhost-{n:05d}",
                "status": "running",
                "template": template["templateId"],
                "launchtime": int(WALL_EPOCH + trio.current_time()),
                "privateIpAddress": f"10.9.{n // 256 % 256}.{n % 256}",
                "instanceRef": user_data.get("instance_ref", ""),
                # The harness's knowledge only (the convergence and store-loss checks read it): no call of the
                # plugin reports tags, and the daemon never lists this cloud.
                "tags": {TAG_CLUSTER: self.cluster, TAG_OP: op},
            }
            ids.append(machine_id)
        created_ms = int((WALL_EPOCH + trio.current_time()) * 1000)
        self.requests[request_id] = {"kind": "create", "machines": ids, "polls": 0, "created_ms": created_ms}
        refs = tuple(self.cloud.machines[m]["instanceRef"] for m in ids)
        self.recorder.creation(Creation(trio.current_time(), self.cloud.name, op, tuple(ids), refs, caller))
        for machine_id in ids:
            for hook in self.cloud.on_created:
                hook(machine_id, self.cloud.machines[machine_id]["instanceRef"], user_data.get("join_token", ""))
        return {"requestId": request_id, "message": f"Request VM success: {count} machines"}

    def _requestReturnMachines(self, document: Mapping[str, Any], op: str, caller: str) -> dict[str, Any]:
        ids = [m["machineId"] for m in document["machines"] if m["machineId"] in self.cloud.machines]
        for machine_id in ids:
            self.cloud.machines[machine_id]["status"] = "terminated"
        request_id = f"lsfret-{next(self._seq):05d}"
        self.requests[request_id] = {"kind": "return", "machines": ids, "polls": 0}
        return {"requestId": request_id, "message": "Delete VM success."}

    def _getRequestStatus(self, document: Mapping[str, Any], op: str, caller: str) -> dict[str, Any]:
        answers = []
        for ref in document["requests"]:
            record = self.requests.get(ref["requestId"])
            if record is None:
                answers.append(
                    {"requestId": ref["requestId"], "status": "complete_with_error", "message": "Request not found"}
                )
                continue
            record["polls"] += 1
            if record["kind"] == "create" and record["polls"] <= 1:
                answers.append({"requestId": ref["requestId"], "status": "running", "message": ""})  # no machines
                continue
            machines = [self._entry(self.cloud.machines[m], record["kind"]) for m in record["machines"]]
            answers.append({"requestId": ref["requestId"], "status": "complete", "message": "", "machines": machines})
        return {"requests": answers}

    @staticmethod
    def _entry(m: Mapping[str, Any], kind: str) -> dict[str, Any]:
        return {
            "machineId": m["machineId"],
            "name": m["name"],
            "result": "succeed",
            "status": "terminated" if kind == "return" else m["status"],
            "privateIpAddress": m["privateIpAddress"],
            "publicIpAddress": None,
            "launchtime": m["launchtime"],
            "message": "",
        }

    def _getReturnRequests(self, document: Mapping[str, Any], op: str, caller: str) -> dict[str, Any]:
        answers = []
        for ref in document.get("machines", []):
            machine = self.cloud.machines.get(ref["machineId"])
            if machine is None or ref["machineId"] in self.cloud.vanished:
                answers.append({"machine": ref["name"], "gracePeriod": 0})  # taken back by the cloud
        return {"status": "complete", "message": "", "requests": answers}

    # --- its record of its requests (the state file) ---------------------------------------------------------

    def record(self) -> StateRead:
        requests = tuple(
            PluginRequest(
                request_id,
                self.template,
                entry["created_ms"],
                tuple(
                    PluginMachine(
                        m,
                        self.cloud.machines[m]["name"],
                        self.cloud.machines[m]["status"],
                        self.cloud.machines[m]["privateIpAddress"],
                        False,
                    )
                    for m in entry["machines"]
                ),
            )
            for request_id, entry in self.requests.items()
            if entry["kind"] == "create"
        )
        return StateRead(RECORD, requests)


@attrs.frozen
class SimPluginRecord:
    """``PluginState`` over the simulated plugin's record (read at once: it is memory)."""

    plugin: SimLsfPlugin

    def read(self) -> StateRead:
        return self.plugin.record()

    async def aread(self) -> StateRead:
        await trio.lowlevel.checkpoint()
        return self.plugin.record()


@attrs.define(eq=False)
class SimCall:
    """One plugin process of a mutation, running in the world (its call directory, in the host's memory)."""

    action: str
    op: str
    key: str
    deadline: float
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    document: Any = None
    error: ProviderError | None = None
    stdout: bytes = b""

    def collected(self) -> Collected:
        return Collected(self.action, self.op, self.key, document=self.document, error=self.error, stdout=self.stdout)


@attrs.define
class SimLegacyHost:
    """What a slot's host keeps across its daemon's restarts: the journal's document and the calls under way."""

    journal_document: Any = None
    calls: list[SimCall] = attrs.field(factory=list)

    @property
    def where(self) -> str:
        return "sim-host/legacy-journal.json"

    def read(self) -> Any:
        return None if self.journal_document is None else json.loads(self.journal_document)

    def write(self, document: dict[str, Any]) -> None:
        self.journal_document = json.dumps(document)


class SimLsfRunner:
    """What the legacy adapter runs its plugin calls with, for one daemon start (``OneShotProvider``'s part)."""

    def __init__(
        self,
        plugin: SimLsfPlugin,
        host: SimLegacyHost,
        config: ProviderConfig,
        lease_of: Callable[[], CallerLease],
        nursery: trio.Nursery,
    ) -> None:
        self.plugin = plugin
        self.host = host
        self.config = config
        self.name = config.name
        self._lease_of = lease_of
        self._nursery = nursery  # the world's: a call outlives the daemon that started it
        self._leftovers = list(host.calls)  # an earlier start's calls: every one, as CallDirs.leftovers() finds them
        self.dead = False  # the process was killed: its calls run on

    def process_died(self) -> None:
        self.dead = True

    async def aclose(self) -> None:
        """Nothing to close."""

    # --- calls an earlier start left ---------------------------------------------------------------------------

    def take_finished(self) -> list[Collected]:
        done = [c for c in self._leftovers if c.done.is_set()]
        return [self._collect(c) for c in done]

    def pending_ops(self) -> set[str]:
        return {c.op for c in self._leftovers if c.op and not c.done.is_set()}

    async def take_op(self, op: str) -> list[Collected]:
        found = []
        for call in [c for c in self._leftovers if c.op == op and op]:
            await call.done.wait()  # the call ends by its deadline at the latest (``_run``)
            found.append(self._collect(call))
        return found

    def _collect(self, call: SimCall) -> Collected:
        self._leftovers.remove(call)
        if call in self.host.calls:
            self.host.calls.remove(call)
        return call.collected()

    # --- a call ------------------------------------------------------------------------------------------------

    async def run_document(
        self,
        action: str,
        document: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        secrets: Collection[str] = (),
        partial: bytearray | None = None,
        key: str = "",
        op: str = "",
    ) -> Any:
        limit = self.config.timeout_for(action) if timeout is None else timeout
        caller = self._lease_of()
        call = SimCall(action, op, key, trio.current_time() + limit)
        if action in MUTATIONS:
            self.host.calls.append(call)  # its call directory, before the plugin starts
            self.plugin.recorder.mutation(Mutation(trio.current_time(), self.name, action, op, caller))
            self.plugin.cloud.note_named(document)  # a legacy return names its machines too (seed 616600159)
        else:
            self.plugin.recorder.note("provider", "call", action=action, caller=caller.instance)
        self._nursery.start_soon(self._run, call, document, caller.instance)
        try:
            await call.done.wait()
        except trio.Cancelled:
            if not self.dead:
                call.scope.cancel()  # the caller lives: its process group dies with the call
                if call in self.host.calls:
                    self.host.calls.remove(call)
            raise
        if call in self.host.calls:
            self.host.calls.remove(call)
        if partial is not None:
            partial.extend(call.stdout)
        if call.error is not None:
            raise call.error
        return call.document

    async def _run(self, call: SimCall, document: Mapping[str, Any], caller: str) -> None:
        """The plugin process: acts at some point, answers (or not) under the cloud's fault window; killed at its
        deadline (``ProviderTimeout``) or when its living caller is cancelled (then nobody reads it)."""
        cloud, rng = self.plugin.cloud, self.plugin.rng
        answer: dict[str, Any] | None = None
        with call.scope:
            with trio.move_on_at(call.deadline) as deadline:
                await trio.sleep(cloud.latency * cloud.slow * (0.2 + rng.random()))
                fault = cloud.fault if cloud.fault and rng.random() < cloud.fault_rate else None
                if fault == "reject":
                    call.error = ProviderFailed(self.name, call.action, "simulated refusal: Request failed")
                    call.done.set()
                    return
                if fault is None or rng.random() < 0.5:  # a fault may strike after the plugin acted
                    try:
                        answer = self.plugin.act(call.action, document, call.op, caller)
                    except ProviderFailed as exc:
                        call.error = exc
                        call.done.set()
                        return
                await trio.sleep(cloud.latency * cloud.slow * rng.random())
                if fault is None and answer is not None:
                    call.document, call.stdout = answer, json.dumps(answer).encode()
                elif fault == "crash":
                    call.error = ProviderCrashed(self.name, call.action, "exited with status 1 and no message")
                elif fault == "garbage":
                    call.error = ProviderProtocolViolation(self.name, call.action, "output is not JSON (simulated)")
                else:  # a hang: it may have printed its answer first
                    if answer is not None and rng.random() < 0.5:
                        call.stdout = json.dumps(answer).encode()
                    await trio.sleep_forever()
            if deadline.cancelled_caught:
                call.error = ProviderTimeout(self.name, call.action, "no answer within its deadline (simulated)")
            if answer is not None and call.document is None and call.op:
                self.plugin.recorder.lost_legacy_answers.add(call.op)
            call.done.set()
        if not call.done.is_set():  # killed by its living caller: nobody reads it
            call.done.set()


def legacy_client(
    plugin: SimLsfPlugin,
    host: SimLegacyHost,
    config: ProviderConfig,
    lease_of: Callable[[], CallerLease],
    nursery: trio.Nursery,
) -> tuple[LegacyProvider, SimLsfRunner]:
    """The production adapter over a simulated plugin, for one daemon start (the runner: to tell it of a kill)."""
    runner = SimLsfRunner(plugin, host, config, lease_of, nursery)
    adapter = LegacyProvider(
        runner,
        LegacySettings(user_data=USER_DATA),
        journal_store=host,
        plugin_state=SimPluginRecord(plugin),
        wall=lambda: WALL_EPOCH + trio.current_time(),
    )
    return adapter, runner
