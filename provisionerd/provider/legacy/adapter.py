"""Legacy mode: an unmodified LSF resource-connector plugin behind our ``PluginTransport`` interface.

A one-shot plugin directory with the five LSF scripts and neither ``describeProvider.sh`` nor ``listMachines.sh``
is *legacy* (``detect_legacy``). ``LegacyProvider`` takes the daemon's calls in our contract and gives the plugin
exactly the LSF documents, nothing of ours:

    requestMachines       {"template": {"templateId", "machineCount"}, "rc_account", "userData"}
    requestReturnMachines {"machines": [{"name", "machineId"}]}
    getRequestStatus      {"requests": [{"requestId"}]}
    getReturnRequests     {"machines": [{"name", "machineId"}]}
    getAvailableTemplates {}

``op_id``, tags and bootstraps stay in the daemon. ``userData`` is the operator's template
(``legacy.rules.UserDataTemplate``), empty by default: a join token reaches a legacy machine only when the operator
wrote ``{join_token}`` into it, and then each machine gets its own ``requestMachines`` call (a token is
single-use, a request's userData is shared by its machines).

The plugin's requestIds are its own; the daemon sees ``lsf:<op_id>`` and ``lsf-return:<op_id>`` and the journal
(``legacy.journal``) maps them. What the plugin cannot promise, the adapter makes up for or says: a repeated op_id
is answered from the journal, never sent twice; an op whose earlier call has an unknown outcome is refused
(``ProviderOutcomeUnknown``), because a retry could make the machines twice and nothing can list them; a requestId
printed before a hang is salvaged; partial fulfilment and unverified returns are reported in the status entries
(``legacy.status``); ``getReturnRequests`` is asked about every machine the journal knows. ``describeProvider``
answers the features the plugin really has (all false); ``listMachines`` and ``stopMachines`` are unsupported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from provisionerd.domain.errors import (
    InvalidRequest,
    LeaseError,
    ProviderError,
    ProviderOutcomeUnknown,
    ProviderUnsupported,
)
from provisionerd.domain.permit import CURRENT_PERMIT
from provisionerd.provider.calls import Collected
from provisionerd.provider.legacy.attribution import LostCall, request_of_lost_call
from provisionerd.provider.legacy.journal import (
    ACCEPTED,
    CALLING,
    NOT_ISSUED,
    REFUSED,
    UNKNOWN,
    CreateOp,
    Journal,
    JournalStore,
    PluginCall,
    ReturnOp,
)
from provisionerd.provider.legacy.plugin_state import PluginState, state_file
from provisionerd.provider.legacy.rules import LEGACY_FEATURES, LSF_ACTIONS, UserDataTemplate, machine_alive
from provisionerd.provider.legacy.shapes import lsf_request, normalise, salvage_request_id, with_machine_ids
from provisionerd.provider.legacy.state_files import READERS, StateRead
from provisionerd.provider.legacy.status import NOT_REPORTED, create_entry, return_entry, unknown_entry
from provisionerd.provider.oneshot import op_of
from provisionerd.provider.runtime import ProviderConfig, check_input, check_output, join_tokens, redactor_for

log = logging.getLogger(__name__)

REQUEST_PREFIX = "lsf:"
RETURN_PREFIX = "lsf-return:"
EXTENSION_ACTIONS = ("describeProvider", "listMachines")
_MAX_RECORDS = 100  # plugin records named per unknown outcome
_POLL_FIRST, _POLL_MAX = 0.2, 5.0  # seconds between status polls of an op being listed while its request runs


def detect_legacy(path: Path, transport: str) -> bool:
    """A one-shot plugin without our extension actions is an LSF resource connector plugin. It must have
    ``requestMachines.sh``: an empty or mistyped directory is not taken for one (its calls fail as they would)."""
    if transport != "oneshot" or not (path / "requestMachines.sh").is_file():
        return False
    return not all((path / f"{a}.sh").is_file() for a in EXTENSION_ACTIONS)


@attrs.frozen
class LegacySettings:
    """The operator's settings for one legacy provider.

    ``user_data``: the userData template (the only channel to the machine). ``rc_account``: the LSF account sent
    when the daemon's input has none. ``journal_path``: where the op_id -> requestId journal lives (empty: memory
    only; then a daemon restart forgets the plugin's requestIds). It must not be inside the plugin's data dir.
    ``state_file``: the layout of the plugin's own state file (``"awsv2"``), read for the orphan report."""

    user_data: UserDataTemplate = UserDataTemplate()
    rc_account: str = "default"
    journal_path: str = ""
    max_ops: int = 4096
    state_file: str = ""  # the layout of the plugin's own state file (``legacy.state_files.READERS``), if known


class CallRunner(Protocol):
    """What the adapter runs its plugin's calls with: ``OneShotProvider`` (the simulation has its own)."""

    name: str
    config: ProviderConfig

    def take_finished(self) -> list[Collected]: ...

    def pending_ops(self) -> set[str]: ...

    async def take_op(self, op: str) -> list[Collected]: ...

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
    ) -> Any: ...


class LegacyProvider:
    """A ``PluginTransport`` over a one-shot legacy plugin. Calls may run concurrently (trio tasks).

    Besides the calls it knows what the typed client (``provisionerd.provider.client.PluginClient``) exposes
    without a call: ``legacy``, its ``features`` (all false) and the ``unknown_outcomes()`` its journal records."""

    legacy = True
    features: Mapping[str, bool] = LEGACY_FEATURES

    def __init__(
        self,
        runner: CallRunner,
        settings: LegacySettings = LegacySettings(),
        *,
        journal_store: JournalStore | None = None,
        plugin_state: PluginState | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``journal_store`` and ``plugin_state`` default to the files ``settings`` names, ``wall`` to the system's
        clock (the simulation gives its simulated host's and its world's)."""
        self._wall = wall
        self.runner = runner
        self.name = runner.name
        self.settings = settings
        self.journal = Journal(settings.journal_path, settings.max_ops, store=journal_store)
        data_dir = str(runner.config.data_dir or "")
        self._state = plugin_state if plugin_state is not None else state_file(settings.state_file, data_dir)
        self._redact = redactor_for(runner.config)
        self._in_flight: set[str] = set()
        self._collect(runner.take_finished())  # calls that ended while no daemon was there to read them

    async def aclose(self) -> None:
        """Nothing to close: each plugin call is its own process."""

    def _wall_ms(self) -> int:
        return int(self._wall() * 1000)

    def unknown_outcomes(self) -> list[dict[str, Any]]:
        """Create ops with a call whose outcome is unknown: for the daemon's recovery (it fails such an op) and the
        orphan report (which cannot see what they made).

        A call an earlier process left is collected first if it has ended: its answer is its outcome (issue 31,
        finding 2: an answer that landed after this process started was reported as unknown, the daemon failed the op,
        and the next call collected the answer as accepted: machines nobody polled). One still running is not
        unknown yet. With a state-file reader, a lost call's request that nothing else can have made is taken as
        its answer first (``legacy.attribution``; a daemon stopped mid-call leaves such a call in the journal)."""
        self._collect(self.runner.take_finished())
        pending = self.runner.pending_ops()  # still running under an earlier process: not unknown yet
        self._attribute_lost(pending)
        found = []
        for op in self.journal.unknown_creates():
            if op.op_id in pending:
                continue
            calls = [c for c in op.calls if c.state in (UNKNOWN, CALLING)]
            refs = [r for c in calls for r in c.refs]
            found.append(
                {"op_id": op.op_id, "template": op.template_id, "instance_refs": refs, "detail": calls[0].detail}
            )
        if found:
            self._what_the_plugin_recorded(found)
        return found

    def _attribute_lost(self, pending: set[str]) -> None:
        """Try ``_attribute`` on every call whose outcome is unknown (not one still running), reading the plugin's
        state file once, and only when there is such a call and a reader."""
        lost = [
            (op, call)
            for op in self.journal.unknown_creates()
            if op.op_id not in pending
            for call in op.calls
            if call.state == UNKNOWN and not call.judged
        ]
        if self._state is None or not lost:
            return
        read = self._state.read()
        for op, call in lost:
            self._attribute(op, call, read)

    def running_ops(self) -> set[str]:
        """The ops of calls an earlier process left that still run (one that ended is collected first)."""
        self._collect(self.runner.take_finished())
        return self.runner.pending_ops()

    def _attribute(self, op: CreateOp, call: PluginCall, read: StateRead) -> bool:
        """Take the plugin request only ``call`` can have made (``legacy.attribution``) as its answer: the call is
        accepted with that requestId and polled as usual, so its machines get their facts. Whether it did."""
        if read.problem:
            return False
        known = {c.request_id for o in self.journal.creates.values() for c in o.calls if c.request_id}
        rivals = [
            LostCall(o.template_id, len(c.refs), c.started_ms, c.ended_ms)
            for o in self.journal.creates.values()
            for c in o.calls
            if c is not call and c.state in (UNKNOWN, CALLING)
        ]
        found = request_of_lost_call(
            LostCall(op.template_id, len(call.refs), call.started_ms, call.ended_ms), read.requests, known, rivals
        )
        if found is None:
            return False
        call.state, call.request_id = ACCEPTED, found.request_id
        call.detail = f"its answer was lost; {found.request_id} found in {read.where}, made by nothing else"[:300]
        self.journal.save()
        log.warning("provider %s: requestMachines %s: %s", self.name, op.op_id, call.detail)
        return True

    def _what_the_plugin_recorded(self, found: list[dict[str, Any]]) -> None:
        """Add to each unknown outcome the plugin's own records the journal does not account for (its state file,
        through the configured reader: ``legacy.state_files``), or exactly what cannot be seen without one."""
        if self._state is None:
            for entry in found:
                entry["cannot_see"] = (
                    f"the machines made for {', '.join(entry['instance_refs'])} (template {entry['template']}): "
                    "no state-file reader is configured for this plugin ([providers.legacy] state_file; "
                    f"known: {', '.join(sorted(READERS))})"
                )
            return
        read = self._state.read()
        if read.problem:
            for entry in found:
                entry["cannot_see"] = (
                    f"the machines made for {', '.join(entry['instance_refs'])} (template {entry['template']}): "
                    f"the plugin's state file {read.where} {read.problem}"
                )
            return
        known = {c.request_id for op in self.journal.creates.values() for c in op.calls if c.request_id}
        unexplained = [r for r in read.requests if r.request_id not in known]
        for entry in found:
            mine = [r for r in unexplained if r.template_id in (entry["template"], "")]
            entry["records_from"] = read.where
            entry["plugin_records"] = [r.as_json() for r in mine[:_MAX_RECORDS]]

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        redact = self._redact.including(join_tokens(action, input))
        check_input(self.name, action, input, redact)
        if action == "describeProvider":
            return {
                "name": self.name,
                "version": "legacy",
                "contractVersion": 1,
                "features": dict(self.features),
                "legacy": True,
            }
        if action == "listMachines":
            self._collect(self.runner.take_finished())
            self._collect(await self.runner.take_op(op_of(input)))
            return await self._list_op(input, timeout)
        if action not in LSF_ACTIONS:
            raise ProviderUnsupported(self.name, action, "a legacy LSF plugin has only the five LSF actions")
        self._collect(self.runner.take_finished())
        for op_id in _ops_named(action, input):
            self._collect(await self.runner.take_op(op_id))  # a call about an op waits for its earlier calls
        permit = CURRENT_PERMIT.get()
        if action in ("requestMachines", "requestReturnMachines") and permit is not None and not permit.valid():
            # That wait can outlast the lease that admitted this call (an earlier process's call hung for minutes):
            # a mutation needs the lease it was admitted under (seed 741612362 of the legacy worlds: a return
            # admitted under 4.2 ran 82 s later under 5.1). No call was made; the op's intent stays committed.
            raise LeaseError(self.name, f"{action}: the lease that admitted it was lost while an earlier call ran")
        deadline = trio.current_time() + (self.runner.config.timeout_for(action) if timeout is None else timeout)
        if action == "requestMachines":
            return await self._request(input, deadline)
        if action == "requestReturnMachines":
            return await self._return(input, deadline)
        if action == "getRequestStatus":
            return await self._status(input, deadline)
        if action == "getReturnRequests":
            return await self._reclaims(input, deadline)
        out = await self._plugin(action, {}, deadline)
        return check_output(self.name, action, out, redact)

    async def _plugin(self, action: str, document: Mapping[str, Any], deadline: float, **kw: Any) -> Any:
        return await self.runner.run_document(action, document, timeout=max(0.0, deadline - trio.current_time()), **kw)

    # --- calls an earlier process left (provider.calls) ----------------------------------------------------------

    def _collect(self, collected: list[Collected]) -> None:
        """Take the outcome of each plugin call an earlier process started and never read (it was killed) as the
        call's answer, as if that process had read it: a requestId becomes an accepted call (polled as usual,
        so its machines are tracked, not leaked), a refusal a refused one, and only a lost answer stays unknown."""
        changed = False
        for done in collected:
            changed |= self._apply(done)
        if changed:
            self.journal.save()

    def _apply(self, done: Collected) -> bool:
        kind, _, rest = done.key.partition(":")
        op_id, _, index = rest.rpartition(":") if kind == "create" else (rest, "", "")
        call: PluginCall | ReturnOp | None = None
        op: CreateOp | None = None
        if (
            kind == "create"
            and (op := self.journal.creates.get(op_id))
            and index.isdigit()
            and int(index) < len(op.calls)
        ):
            call = op.calls[int(index)]
        elif kind == "return":
            call = self.journal.returns.get(op_id)
        if call is None or getattr(call, "key", done.key) != done.key or call.state not in (UNKNOWN, CALLING):
            log.warning(
                "provider %s: a %s call left by an earlier process (key %r) matches no open journal record: %s",
                self.name,
                done.action,
                done.key,
                _summary(done),
            )
            return False
        if not done.started:
            call.state, call.detail = (NOT_ISSUED if kind == "create" else UNKNOWN), "the plugin never started"
            return True
        request_id = None
        if done.error is None:
            try:
                out = check_output(self.name, done.action, done.document, self._redact)
                request_id = out["requestId"]
            except ProviderError as exc:
                done = attrs.evolve(done, error=exc)
        if request_id is None and done.error is not None:
            unknown = getattr(done.error, "outcome_unknown", True)
            request_id = salvage_request_id(bytearray(done.stdout)) if unknown else None
            if request_id is None:
                call.state = UNKNOWN if unknown else REFUSED
                call.detail = f"collected after a restart: {type(done.error).__name__}: {done.error}"[:300]
                if isinstance(call, PluginCall):
                    call.ended_ms = self._wall_ms()  # it had ended by now
                log.warning("provider %s: %s %s: %s", self.name, done.action, op_id, call.detail)
                if call.state == UNKNOWN and isinstance(call, PluginCall) and self._state and op is not None:
                    self._attribute(op, call, self._state.read())
                return True
        call.state, call.request_id = ACCEPTED, request_id
        call.detail = "collected after a restart"
        log.warning(
            "provider %s: %s of op %s answered %s while the daemon was down: tracked from the collected output",
            self.name,
            done.action,
            op_id,
            request_id,
        )
        return True

    # --- requestMachines -------------------------------------------------------------------------------------------

    async def _request(self, doc: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        op_id = doc["op_id"]
        template = doc["template"]
        if op_id in self._in_flight:
            raise ProviderOutcomeUnknown(self.name, "requestMachines", f"op {op_id!r} is still being requested")
        known = self.journal.creates.get(op_id)
        if known is not None:
            return self._replay(known, template)
        refs = [b["instanceRef"] for b in doc["bootstrap"]]
        per_machine = self.settings.user_data.per_machine
        op = CreateOp(
            op_id,
            template["templateId"],
            len(refs),
            [PluginCall([r]) for r in refs] if per_machine else [PluginCall(refs)],
        )
        self.journal.creates[op_id] = op
        self._in_flight.add(op_id)
        try:
            failure = await self._issue(op, doc, deadline)
        finally:
            self._in_flight.discard(op_id)
            for call in op.calls:
                if call.state == CALLING:  # cancelled while the plugin ran (a lost lease, shutdown): unknown
                    call.state, call.detail = UNKNOWN, "the call was cancelled while the plugin ran"
                    call.ended_ms = self._wall_ms()  # its process group was killed
            self.journal.save()
        if not op.accepted():
            assert failure is not None
            if not failure.outcome_unknown:
                del self.journal.creates[op_id]  # refused: nothing happened, a later attempt is a fresh start
                self.journal.save()
            raise failure
        ids = ", ".join(c.request_id or "" for c in op.accepted())
        return {"requestId": REQUEST_PREFIX + op_id, "message": f"plugin request(s) {ids}"}

    def _replay(self, op: CreateOp, template: Mapping[str, Any]) -> dict[str, Any]:
        if (op.template_id, op.count) != (template["templateId"], template["machineCount"]):
            raise InvalidRequest(
                self.name, "requestMachines", f"op_id {op.op_id!r} was used for {op.count} x {op.template_id!r}"
            )
        if op.accepted():
            ids = ", ".join(c.request_id or "" for c in op.accepted())
            return {"requestId": REQUEST_PREFIX + op.op_id, "message": f"already requested as {ids}: not sent again"}
        detail = next((c.detail for c in op.calls if c.state == UNKNOWN), "")
        raise ProviderOutcomeUnknown(
            self.name,
            "requestMachines",
            f"op {op.op_id!r}: an earlier call's outcome is unknown ({detail}); a legacy plugin has no idempotency "
            "and no listing, so it is not retried",
        )

    async def _issue(self, op: CreateOp, doc: Mapping[str, Any], deadline: float) -> ProviderError | None:
        """Make the op's plugin calls in order; stop at the first failure (returned, not raised)."""
        for index, call in enumerate(op.calls):
            if index > 0 and trio.current_time() >= deadline:
                for later in op.calls[index:]:
                    later.detail = "not requested: no time left within the call's deadline"
                return None
            permit = CURRENT_PERMIT.get()
            if index > 0 and permit is not None and not permit.valid():
                for later in op.calls[index:]:  # each call is a mutation: none without the lease (domain.permit)
                    later.detail = "not requested: the lease that admitted the op is no longer held"
                return None
            lsf, secrets = lsf_request(doc, call.refs, self.settings.user_data, self.settings.rc_account)
            call.state, call.key, call.started_ms = CALLING, f"create:{op.op_id}:{index}", self._wall_ms()
            self.journal.save()  # before the plugin runs: a crash from here on leaves an unknown outcome behind
            partial = bytearray()
            try:
                out = await self._plugin(
                    "requestMachines", lsf, deadline, secrets=secrets, partial=partial, key=call.key, op=op.op_id
                )
                out = check_output(self.name, "requestMachines", out, self._redact.including(secrets))
            except ProviderError as exc:
                salvaged = salvage_request_id(partial) if exc.outcome_unknown else None
                if salvaged is not None:
                    call.state, call.request_id, call.detail = ACCEPTED, salvaged, "requestId printed before a hang"
                    log.warning(
                        "provider %s: requestMachines %s printed %s, then %s",
                        self.name,
                        op.op_id,
                        salvaged,
                        type(exc).__name__,
                    )
                    continue
                call.state = UNKNOWN if exc.outcome_unknown else REFUSED
                call.detail = f"{type(exc).__name__}: {exc.detail}"[:300]
                call.ended_ms = self._wall_ms()
                if call.state == UNKNOWN:
                    call.judged = True  # attributed now or never: the op is failed if nothing is found
                if call.state == UNKNOWN and self._state is not None:
                    if self._attribute(op, call, await self._state.aread()):
                        continue
                for later in op.calls[index + 1 :]:
                    later.detail = "not requested after an earlier call failed"
                return exc
            call.state, call.request_id = ACCEPTED, out["requestId"]
        return None

    # --- requestReturnMachines -------------------------------------------------------------------------------------

    async def _return(self, doc: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        op_id = doc["op_id"]
        known = self.journal.returns.get(op_id)
        if known is not None and known.state == ACCEPTED:
            return {"requestId": RETURN_PREFIX + op_id, "message": f"already returning as {known.request_id}"}
        # Unlike a create, a return whose outcome is unknown is sent again: giving back a machine twice is harmless.
        machines = [{"name": m["name"], "machineId": m["machineId"]} for m in doc["machines"]]
        rop = ReturnOp(op_id, machines)
        self.journal.returns[op_id] = rop
        self.journal.save()
        partial = bytearray()
        try:
            out = await self._plugin(
                "requestReturnMachines",
                {"machines": machines},
                deadline,
                partial=partial,
                key=f"return:{op_id}",
                op=op_id,
            )
            out = check_output(self.name, "requestReturnMachines", out, self._redact)
        except ProviderError as exc:
            salvaged = salvage_request_id(partial) if exc.outcome_unknown else None
            if salvaged is None:
                rop.state, rop.detail = (UNKNOWN if exc.outcome_unknown else REFUSED), type(exc).__name__
                self.journal.save()
                raise
            out = {"requestId": salvaged, "message": "requestId printed before a hang"}
        rop.state, rop.request_id = ACCEPTED, out["requestId"]
        self.journal.save()
        return {"requestId": RETURN_PREFIX + op_id, "message": out.get("message", "")}

    # --- getRequestStatus ------------------------------------------------------------------------------------------

    async def _status(self, doc: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        asked = [r["requestId"] for r in doc["requests"]]
        index = self.journal.machine_index()
        wanted: dict[str, None] = {}  # plugin requestIds, in order, once each
        for rid in asked:
            if rid.startswith(REQUEST_PREFIX) and (op := self.journal.creates.get(rid[len(REQUEST_PREFIX) :])):
                wanted.update((c.request_id, None) for c in op.accepted() if c.request_id)
            elif rid.startswith(RETURN_PREFIX) and (rop := self.journal.returns.get(rid[len(RETURN_PREFIX) :])):
                if rop.request_id:
                    wanted[rop.request_id] = None
                # The machines' create requests, in the same call: a claimed return is checked against them.
                wanted.update(
                    (index[m["machineId"]][1].request_id, None) for m in rop.machines if m["machineId"] in index
                )
            elif not rid.startswith((REQUEST_PREFIX, RETURN_PREFIX)):
                wanted[rid] = None  # a plugin requestId asked directly (an operator, the kit)
        entries: dict[str, dict[str, Any]] = {}
        if wanted:
            out = await self._plugin("getRequestStatus", {"requests": [{"requestId": i} for i in wanted]}, deadline)
            out = check_output(self.name, "getRequestStatus", normalise(out), self._redact)
            entries = {e["requestId"]: e for e in out["requests"]}
        answer = []
        changed = False
        for rid in asked:
            if rid.startswith(REQUEST_PREFIX):
                op = self.journal.creates.get(rid[len(REQUEST_PREFIX) :])
                if op is None:
                    answer.append(unknown_entry(rid, "unknown request: the legacy journal has no record of it"))
                    continue
                entry, new = create_entry(rid, op, entries)
                changed |= new
                answer.append(entry)
            elif rid.startswith(RETURN_PREFIX):
                rop = self.journal.returns.get(rid[len(RETURN_PREFIX) :])
                if rop is None:
                    answer.append(unknown_entry(rid, "unknown request: the legacy journal has no record of it"))
                    continue
                creates = {
                    m["machineId"]: entries.get(index[m["machineId"]][1].request_id)
                    for m in rop.machines
                    if m["machineId"] in index
                }
                answer.append(return_entry(rid, rop, entries.get(rop.request_id or ""), creates))
            else:
                answer.append(entries.get(rid) or unknown_entry(rid, "the plugin did not report this request"))
        if changed:
            self.journal.save()
        return check_output(self.name, "getRequestStatus", {"requests": answer}, self._redact)

    # --- listMachines, for one op only ---------------------------------------------------------------------------

    async def _list_op(self, doc: Mapping[str, Any], timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        """The machines of one op (a filter naming ``provisionerd:op``), from the journal's requestIds: what the
        daemon's recovery asks after a timeout or a restart. Nothing else can be listed: a filter without an op,
        an op the journal does not know, one with a call still running, or one whose calls all have an unknown
        outcome is ``ProviderUnsupported``, so no caller mistakes "not found here" for "does not exist"."""
        op_id = doc["tags"].get("provisionerd:op")
        op = self.journal.creates.get(op_id) if op_id else None
        if op_id and op is None and 0 < len(self.journal.creates) < self.journal.max_ops:
            # The journal records every create op before its plugin runs, has a history (not a lost or new file)
            # and has dropped none: an op it does not know was never called (a daemon killed between its intent
            # and the call), so nothing was made.
            return check_output(self.name, "listMachines", {"machines": []}, self._redact)
        # An op with a call whose outcome is unknown lists what its answered calls made (a per-machine op whose
        # last call hung past the deadline: seed 270 of the legacy worlds); what the unknown call made is invisible
        # and named by the orphan report (``unknown_outcomes``). One still running, or with nothing answered, is not
        # listed: "none listed" would read as "none made".
        lost = any(c.state == UNKNOWN for c in op.calls) if op is not None else False
        if op is None or any(c.state == CALLING for c in op.calls) or (lost and not op.accepted()):
            why = (
                "a legacy LSF plugin cannot list machines (tagged_unknown and ghost orphans are invisible)"
                if op_id is None
                else f"op {op_id!r} "
                + (
                    "is not in the legacy journal"
                    if op is None
                    else "has a call still running"
                    if any(c.state == CALLING for c in op.calls)
                    else "has a call whose outcome is unknown and none answered"
                )
            )
            raise ProviderUnsupported(self.name, "listMachines", why)
        entry = await self._settled_entry(op, timeout)
        machines = [
            {
                "machineId": m["machineId"],
                "name": m.get("name", ""),
                "status": m.get("status", ""),
                "launchtime": m.get("launchtime", 0),
                "privateIpAddress": m.get("privateIpAddress"),
                "instanceRef": m.get("instanceRef", ""),
                "tags": {},
            }
            for m in entry["machines"]
            if machine_alive(m)
        ]
        return check_output(self.name, "listMachines", {"machines": machines}, self._redact)

    async def _settled_entry(self, op: CreateOp, timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        """The op's status entry once its plugin request is no longer running (LSF plugins often report no
        machines while a request runs, and "none listed" must not read as "none made": after a restart this is
        how a request the daemon never saw the end of is polled as usual). ``ProviderUnsupported`` when the
        plugin does not report the request, or it still runs at the deadline (the caller tries again later)."""
        deadline = trio.current_time() + (
            self.runner.config.timeout_for("listMachines") if timeout is None else timeout
        )
        delay = _POLL_FIRST
        while True:
            left = max(0.0, deadline - trio.current_time())
            status = await self.call(
                "getRequestStatus", {"requests": [{"requestId": REQUEST_PREFIX + op.op_id}]}, timeout=left
            )
            (entry,) = status["requests"]
            if entry["status"] == "running" and NOT_REPORTED in entry["message"]:
                raise ProviderUnsupported(self.name, "listMachines", f"op {op.op_id!r}: {entry['message']}")
            if entry["status"] != "running" or sum(machine_alive(m) for m in entry["machines"]) >= op.count:
                return entry
            if trio.current_time() + delay >= deadline:
                raise ProviderUnsupported(
                    self.name, "listMachines", f"op {op.op_id!r}: its plugin request is still running"
                )
            await trio.sleep(delay)
            delay = min(2 * delay, _POLL_MAX)

    # --- getReturnRequests -----------------------------------------------------------------------------------------

    async def _reclaims(self, doc: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        machines = {m["machineId"]: {"name": m["name"], "machineId": m["machineId"]} for m in doc["machines"]}
        returned = self.journal.returned_ids()
        for mid, (_, seen) in self.journal.machine_index().items():
            if mid not in machines and mid not in returned:
                machines[mid] = {"name": seen.name, "machineId": mid}  # every machine we know of, asked or not
        out = await self._plugin("getReturnRequests", {"machines": list(machines.values())}, deadline)
        return check_output(self.name, "getReturnRequests", with_machine_ids(out, machines.values()), self._redact)


def _ops_named(action: str, document: Mapping[str, Any]) -> list[str]:
    """The ops a call is about (whose earlier calls it must wait for)."""
    if action == "getRequestStatus":
        ids = [r.get("requestId", "") for r in document.get("requests", ()) if isinstance(r, Mapping)]
        return [i.split(":", 1)[1] for i in ids if isinstance(i, str) and i.startswith((REQUEST_PREFIX, RETURN_PREFIX))]
    op = op_of(document)
    return [op] if op else []


def _summary(done: Collected) -> str:
    if not done.started:
        return "never started"
    if done.error is not None:
        return f"{type(done.error).__name__}: {done.error}"[:300]
    request_id = done.document.get("requestId") if isinstance(done.document, Mapping) else None
    return f"answered requestId {request_id!r}"
