"""The simulated provider: one in-memory cloud shared by every daemon, with seeded faults and a record of every
mutation together with the caller's lease at that instant.

``SimCloud`` keeps the contract through ``FakeProvider`` (same op_id, same request; owner tags on every machine;
``listMachines`` by tags) and adds what a real cloud does to you:

- ``latency`` per call, drawn from the seed;
- a *fault window* (set by the fault schedule) during which calls fail: ``reject`` (a typed refusal such as
  ``CapacityUnavailable`` before anything happens; ``internal``, a code the contract does not know, is
  ``ProviderFailed``), ``hang`` (no answer until the caller's timeout, maybe after
  doing the work), ``crash`` (the plugin dies, maybe after doing the work), ``garbage`` (an answer that breaks the
  contract, maybe after doing the work; a poll or listing that names machines answers them with a ``launchtime``
  the schema takes and no float holds, which the daemon's reader must refuse as it refuses the rest);
- ``idempotent=False``: a cloud without client tokens, where the same op_id again creates machines again (the
  daemon must look for the op_id's tag before retrying);
- ``vanish``: a machine disappears behind our back;
- ``foreign_rate``: ``requestMachines`` takes effect, then answers a requestId the cloud never made (its status call
  says ``unknown request``).

Each daemon instance talks to it through its own ``CloudClient`` (a ``PluginTransport``; ``PluginClient`` over it is
the typed client), which is how the cloud knows who called: the client snapshots the caller's lease keeper when the
call starts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import trio

from provisionerd.domain.errors import ProviderCrashed, ProviderProtocolViolation, ProviderTimeout, rejection
from provisionerd.provider.runtime import check_input, join_tokens
from provisionerd.telemetry.redaction import Redactor
from provisionerd.testing.fake_provider import FakeProvider
from provisionerd.testing.simulation.invariants import MUTATING
from provisionerd.testing.simulation.observe import CallerLease, Creation, Mutation, Recorder

#: The wall clock of the simulated world is trio's clock plus this (launch times, host ``since``).
WALL_EPOCH = 1_700_000_000.0
FAULT_KINDS = ("reject", "hang", "crash", "garbage")
#: The requestId a ``foreign_id`` window answers: the cloud never made a request with it.
FOREIGN_ID = "req-foreign"
REJECT_CODES = ("capacity_unavailable", "throttled", "quota_exceeded", "internal")


class SimCloud(FakeProvider):
    def __init__(
        self,
        name: str,
        rng: random.Random,
        recorder: Recorder,
        *,
        templates: Mapping[str, int],
        idempotent: bool = True,
        latency: float = 0.2,
        gang_partial: float = 0.0,
        gang_rng: random.Random | None = None,
        gang_until: float = math.inf,
    ) -> None:
        """``gang_partial``: the share of new all-or-nothing requests answered in part (one machine fewer) before
        ``gang_until`` (trio's clock: the faults' horizon, so that the world can settle after), drawn from
        ``gang_rng`` (so that no other draw of the cloud changes)."""
        super().__init__(name, templates, latency=latency)
        self.rng = rng
        self.recorder = recorder
        self.gang_partial = gang_partial
        self._gang_rng = gang_rng or random.Random(0)
        self._gang_until = gang_until
        #: op_id -> machines asked, of each all-or-nothing request that reached the cloud (``check_whole_ops``).
        self.whole_asked: dict[str, int] = {}
        self.idempotent = idempotent
        self.fault: str | None = None  # the current fault window's kind
        self.fault_rate = 0.0
        self.slow = 1.0  # latency multiplier (a "slow" window)
        self.foreign_rate = 0.0  # a "foreign_id" window: the share of requests answered with an id never made
        self._caller = ""
        self.on_vanished: list[Callable[[str, str], None]] = []
        #: Machine id -> when a return or stop first named it (the store-loss check tells those from forgotten).
        self.named_by_mutation: dict[str, float] = {}
        #: Machine ids a ``vanish`` fault took, or a spot reclaim (``reclaimed`` too).
        self.vanished: set[str] = set()
        self.reclaimed: set[str] = set()
        #: Called with (machine_id, instance_ref, join_token) for each machine created (a booting worker).
        self.on_created: list[Callable[[str, str, str], None]] = []

    # --- faults set by the schedule ------------------------------------------------------------------------------

    def set_fault(self, kind: str | None, rate: float = 0.5) -> None:
        self.fault, self.fault_rate = kind, rate
        self.recorder.note("provider", "fault", kind=kind, rate=rate)

    def vanish(self) -> str | None:
        """A random running machine disappears (reclaimed, failed hardware). Returns its id."""
        running = sorted(m for m, doc in self.machines.items() if doc["status"] == "running")
        if not running:
            return None
        machine_id = self.rng.choice(running)
        self.machines[machine_id]["status"] = "terminated"
        self.vanished.add(machine_id)
        self.recorder.gone.add(machine_id)
        self.recorder.note("provider", "vanished", machine=machine_id)
        for hook in self.on_vanished:
            hook(machine_id, self.machines[machine_id]["instanceRef"])
        return machine_id

    def reclaim(self, machine_id: str) -> None:
        """The cloud takes ``machine_id`` back at the end of its interruption notice (a spot reclaim): it ends, and
        the cloud's API shows that it did (``getReturnRequests``), as EC2 shows a reclaimed spot instance."""
        self.machines[machine_id]["status"] = "terminated"
        self.vanished.add(machine_id)
        self.reclaimed.add(machine_id)
        self.recorder.gone.add(machine_id)
        self.recorder.note("provider", "reclaimed", machine=machine_id)
        for hook in self.on_vanished:
            hook(machine_id, self.machines[machine_id]["instanceRef"])

    def running(self) -> list[dict[str, Any]]:
        return [doc for _, doc in sorted(self.machines.items()) if doc["status"] == "running"]

    def note_named(self, document: Mapping[str, Any]) -> None:
        """Remember the machines a return or stop names (its ``machines``), at their first naming: the checks that
        tell a returned machine from a forgotten one read it (``store_loss``, ``lifecycle.spot_notice``). Both the
        contract's calls and the legacy LSF plugin's (``lsf.SimLsfRunner``) come here."""
        for machine in document.get("machines", ()):
            if isinstance(machine, Mapping):
                self.named_by_mutation.setdefault(str(machine.get("machineId", "")), trio.current_time())

    # --- calls -----------------------------------------------------------------------------------------------------

    async def call_as(
        self,
        caller: CallerLease,
        action: str,
        input: Mapping[str, Any],
        timeout: float | None,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        check_input(self.name, action, input, Redactor().including(join_tokens(action, input)))
        if action in MUTATING:
            self.recorder.mutation(Mutation(trio.current_time(), self.name, action, str(input["op_id"]), caller))
            self.note_named(input)
        else:
            self.recorder.note("provider", "call", action=action, caller=caller.instance)
        delay = self.latency * self.slow * (0.2 + self.rng.random())
        if action in MUTATING:
            # A mutation that reached the cloud completes even when its caller dies meanwhile (a one-shot call
            # runs on in its own session; an API request is in the cloud's hands): issue 31 item 7, "a daemon kill
            # at every step of a slow call". The restarted daemon must find what it made (its recovery lists the
            # op by tag), or the run ends with an unexplained machine.
            with trio.CancelScope(shield=True):
                await trio.sleep(delay)
                fault = self.fault if self.fault and self.rng.random() < self.fault_rate else None
                works = fault is None or (fault != "reject" and self.rng.random() < 0.5)
                output = self._do(caller.instance, action, input) if works and fault != "reject" else None
            try:
                return await self._answer(action, input, fault, output, timeout)
            except trio.Cancelled:
                if output is not None:  # done, and its caller is gone: counted (``after_caller_died``)
                    self.recorder.note("provider", "after_caller_died", action=action, op_id=str(input["op_id"]))
                raise
        await trio.sleep(delay)
        fault = self.fault if self.fault and self.rng.random() < self.fault_rate else None
        works = fault is None or (fault != "reject" and self.rng.random() < 0.5)
        output = self._do(caller.instance, action, input) if works and fault != "reject" else None
        return await self._answer(action, input, fault, output, timeout)

    async def _answer(
        self,
        action: str,
        input: Mapping[str, Any],
        fault: str | None,
        output: dict[str, Any] | None,
        timeout: float | None,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        """The answer the caller gets for a call made (``output``) or not, under ``fault``."""
        if fault == "reject":
            code = self.rng.choice(REJECT_CODES)
            raise rejection(self.name, action, code, f"simulated {code}")
        if fault == "hang":
            waited = timeout if timeout is not None else 60.0
            await trio.sleep(waited)
            raise ProviderTimeout(self.name, action, f"no answer within {waited:g} s (simulated)")
        if fault == "crash":
            raise ProviderCrashed(self.name, action, "the plugin exited with status 1 (simulated)")
        if fault == "garbage":
            unreadable = _unreadable(action, output)
            if unreadable is not None:
                return unreadable  # the daemon's reader must refuse it (typed), as it refuses what is not JSON
            raise ProviderProtocolViolation(self.name, action, "output is not JSON (simulated)")
        assert output is not None
        if action == "requestMachines" and self.foreign_rate and self.rng.random() < self.foreign_rate:
            self.recorder.foreign_answer(str(input["op_id"]))
            return {**output, "requestId": FOREIGN_ID}
        return output

    def _do(self, caller: str, action: str, input: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append((action, {"op_id": input.get("op_id", "")}))
        self._caller = caller
        handler: Callable[[Mapping[str, Any]], dict[str, Any]] = getattr(self, "_" + action)
        return handler(input)

    def _describeProvider(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._describeProvider(doc)
        out["features"]["idempotentRequest"] = self.idempotent  # a cloud without client tokens says so
        return out

    def _getReturnRequests(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Besides what the cloud wants back, a vanished machine the caller asks about whose end the cloud's API
        shows (a terminated instance, as an EC2 plugin reports it, with no grace): every other one, by its number,
        so that no seed's draws change. The rest vanish silently, found only by the orphan cycle's listings (a
        ghost). Seed 859784707: a machine that vanished late, after a store loss had opened the orphan breaker,
        was replaced only as a confirmed ghost, past the settle window."""
        out = super()._getReturnRequests(doc)
        named = {r["machineId"] for r in out["requests"]}
        for asked in doc.get("machines", ()):
            machine_id = asked["machineId"]
            shown = machine_id in self.reclaimed or _shows_end(machine_id)
            if machine_id in self.vanished and machine_id not in named and shown:
                out["requests"].append({"machine": asked["name"], "machineId": machine_id, "gracePeriod": 0})
        return out

    def _requestMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        op_id = doc["op_id"]
        if not self.idempotent and op_id in self.ops:
            del self.ops[op_id]  # no client token: the cloud does not know it has seen this request
        before = set(self.machines)
        count = int(doc["template"]["machineCount"])
        if doc.get("allOrNothing") and op_id not in self.ops:
            self.whole_asked[op_id] = count
            broken = self.gang_partial and trio.current_time() < self._gang_until
            if count >= 2 and broken and self._gang_rng.random() < self.gang_partial:
                self.fall_short = 1  # the promise broken: one machine fewer, complete_with_error
        self.launch_time = int(WALL_EPOCH + trio.current_time())  # the cloud's clock agrees with the world's
        out = super()._requestMachines(doc)
        new = tuple(m for m in self.machines if m not in before)
        if new:
            refs = tuple(self.machines[m]["instanceRef"] for m in new)
            self.recorder.creation(Creation(trio.current_time(), self.name, op_id, new, refs, self._caller))
            tokens = {b["instanceRef"]: b["joinToken"] for b in doc["bootstrap"]}
            for machine_id, ref in zip(new, refs, strict=True):
                for hook in self.on_created:
                    hook(machine_id, ref, tokens[ref])  # the machine boots with its bootstrap (token included)
        return out


#: A ``launchtime`` the schema takes (an integer >= 0) that no float holds: a plugin's answer no reader can read.
UNREADABLE_LAUNCH = 10**400


def _unreadable(action: str, output: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A poll's or a listing's answer, made, with every machine's ``launchtime`` one no float holds (the ``garbage``
    fault's answer to a read that names machines: valid by the schema, unreadable by the daemon); None for any
    other answer. The machines are copies: the cloud's own stay as they are."""
    if output is None:
        return None
    if action == "listMachines" and output.get("machines"):
        return {**output, "machines": [{**m, "launchtime": UNREADABLE_LAUNCH} for m in output["machines"]]}
    if action == "getRequestStatus" and any(r.get("machines") for r in output.get("requests", ())):
        requests = [
            {**r, "machines": [{**m, "launchtime": UNREADABLE_LAUNCH} for m in r.get("machines", ())]}
            for r in output["requests"]
        ]
        return {**output, "requests": requests}
    return None


def _shows_end(machine_id: str) -> bool:
    """Whether the cloud's API shows that a vanished machine ended (even-numbered ids; odd ones vanish silently)."""
    digits = machine_id.rsplit("-", 1)[-1]
    return digits.isdigit() and int(digits) % 2 == 0


class CloudClient:
    """A daemon instance's ``PluginTransport`` for the cloud: knows whose lease to snapshot on each call."""

    def __init__(self, cloud: SimCloud, lease_of: Callable[[], CallerLease]) -> None:
        self.name = cloud.name
        self._cloud = cloud
        self._lease_of = lease_of

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        return await self._cloud.call_as(self._lease_of(), action, input, timeout)

    async def aclose(self) -> None:
        """Nothing to close."""
