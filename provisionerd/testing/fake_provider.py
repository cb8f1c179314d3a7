"""An in-memory ``PluginTransport`` for tests of the layers above the runtime (daemon core, reconcile, orphans).

It is a fake at the raw level (documents), so the typed level above it is the real one: ``PluginClient(fake)`` is
the ``ProviderClient`` a test hands to code that speaks the typed methods, and the fake is kept for assertions
(``calls``, ``machines``) and for injecting failures. It keeps the contract the real runtime enforces: inputs and
outputs are checked against the same schemas, the same ``op_id`` gives the same request and machines, machines carry
the owner tags plus ``provisionerd:instance``, ``listMachines`` filters by tags, returning twice is harmless. No I/O
and no real time: it works under ``trio.testing.MockClock`` (``latency`` is slept on trio's clock).

Failures are injected per action with ``fail_next(action, error)`` (a typed error, e.g. ``Throttled(name, action,
message)`` or ``rejection(name, action, code, message)``); ``calls`` records every call for assertions.
"""

from __future__ import annotations

import collections
import copy
import itertools
from collections.abc import Mapping
from typing import Any

import trio

from provisionerd.domain.errors import CapacityUnavailable, InvalidRequest, ProviderError, ProviderProtocolViolation
from provisionerd.provider.runtime import check_input, join_tokens
from provisionerd.provider.schemas import contract
from provisionerd.telemetry.redaction import Redactor

#: Every template's attributes: what a healthy machine's agent reports (``FakeProvider.report``).
TEMPLATE_ATTRIBUTES: Mapping[str, tuple[str, str]] = {"ncpus": ("Numeric", "2")}


class FakeProvider:
    """A provider with ``templates`` (``{templateId: maxNumber}``) living in memory."""

    def __init__(
        self,
        name: str = "fake",
        templates: Mapping[str, int] | None = None,
        *,
        latency: float = 0.0,
        launch_time: int = 1_700_000_000,
        prices: Mapping[str, float] | None = None,
        attributes: Mapping[str, Mapping[str, tuple[str, str]]] | None = None,
    ) -> None:
        """``attributes``: a template's own (templateId -> {name: (kind, value)}) in place of
        ``TEMPLATE_ATTRIBUTES``."""
        self.name = name
        self.attributes = {t: dict(a) for t, a in (attributes or {}).items()}
        self.templates = dict(templates or {"small": 10})
        self.prices = dict(prices or {})  # templateId -> USD per hour
        self.latency = latency
        self.launch_time = launch_time
        self.machines: dict[str, dict[str, Any]] = {}  # machineId -> machine (status "running" | "terminated")
        self.requests: dict[str, list[str]] = {}  # requestId -> machineIds
        self.ops: dict[str, str] = {}  # op_id -> requestId
        self.wanted_back: set[str] = set()  # machineIds getReturnRequests reports (reclaimed, spot)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        #: Machines left out of the next all-or-nothing request (a cloud that breaks the promise: it launches that
        #: many fewer and says ``complete_with_error``); 0 keeps it. Reset after one request.
        self.fall_short = 0
        self._short: dict[str, int] = {}  # requestId -> machines it left out
        self._failures: dict[str, collections.deque[ProviderError]] = collections.defaultdict(collections.deque)
        self._seq = itertools.count(1)

    def fail_next(self, action: str, error: ProviderError) -> None:
        """Make the next call of ``action`` raise ``error`` (after its input was checked, like a real plugin)."""
        self._failures[action].append(error)

    def template_attributes(self, template: str) -> Mapping[str, tuple[str, str]]:
        return self.attributes.get(template, TEMPLATE_ATTRIBUTES)

    def report(self, template: str = "") -> dict[str, str]:
        """What the agent of a healthy machine of ``template`` reports (``Join.capabilities``): its attributes."""
        return {name: value for name, (_, value) in self.template_attributes(template).items()}

    def reclaim(self, machine_id: str) -> None:
        """The provider wants ``machine_id`` back (it shows in ``getReturnRequests``)."""
        self.wanted_back.add(machine_id)

    async def aclose(self) -> None:
        """Nothing to close."""

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        check_input(self.name, action, input, Redactor().including(join_tokens(action, input)))
        self.calls.append((action, copy.deepcopy(dict(input))))
        if self.latency:
            await trio.sleep(self.latency)
        else:
            await trio.lowlevel.checkpoint()
        if self._failures[action]:
            raise self._failures[action].popleft()
        handler = getattr(self, "_" + action)
        output = handler(input)
        problems = contract().output_problems(action, output)
        if problems:  # a bug in the fake itself: fail loudly, typed
            raise ProviderProtocolViolation(self.name, action, "; ".join(problems))
        return output

    # --- actions ---------------------------------------------------------------------------------------------------

    def _describeProvider(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        # allOrNothing: a request either fits the template's room whole or is refused (``fall_short`` breaks it)
        features = dict.fromkeys(("idempotentRequest", "listMachines", "tags", "allOrNothing"), True)
        features.update(priceQuotes=bool(self.prices), stopMachines=False)
        return {"name": self.name, "version": "fake", "contractVersion": 1, "features": features}

    def _getAvailableTemplates(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        templates = []
        for template, count in self.templates.items():
            entry: dict[str, Any] = {
                "templateId": template,
                "maxNumber": count,
                "attributes": {name: list(pair) for name, pair in self.template_attributes(template).items()},
            }
            if template in self.prices:
                entry["price"] = {
                    "amount": self.prices[template],
                    "currency": "USD",
                    "unit": "hour",
                    "source": "fake",
                    "timestamp": "2024-01-01T00:00:00Z",
                }
            templates.append(entry)
        return {"templates": templates}

    def _requestMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        op_id = doc["op_id"]
        if op_id in self.ops:
            return {"requestId": self.ops[op_id], "message": "same op_id: same request"}
        template = doc["template"]["templateId"]
        if template not in self.templates:
            raise InvalidRequest(self.name, "requestMachines", f"unknown template {template!r}")
        live = sum(1 for m in self.machines.values() if m["status"] == "running" and m["template"] == template)
        if live + doc["template"]["machineCount"] > self.templates[template]:
            raise CapacityUnavailable(self.name, "requestMachines", "no capacity")
        request_id = f"req-{next(self._seq)}"
        ids = []
        boots = list(doc["bootstrap"])
        if doc.get("allOrNothing") and self.fall_short:
            short, self.fall_short = min(self.fall_short, len(boots)), 0
            boots = boots[: len(boots) - short]
            self._short[request_id] = short
        for boot in boots:
            n = next(self._seq)
            machine_id = f"m-{n}"
            tags = dict(doc["tags"], **{"provisionerd:instance": boot["instanceRef"]})
            self.machines[machine_id] = {
                "machineId": machine_id,
                "name": f"host-{n}",
                "status": "running",
                "template": template,
                "launchtime": self.launch_time,
                "privateIpAddress": f"10.0.{n // 256}.{n % 256}",
                "instanceRef": boot["instanceRef"],
                "tags": tags,
            }
            ids.append(machine_id)
        self.requests[request_id] = ids
        self.ops[op_id] = request_id
        return {"requestId": request_id, "message": ""}

    def _requestReturnMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        op_id = doc["op_id"]
        if op_id not in self.ops:
            ids = [m["machineId"] for m in doc["machines"] if m["machineId"] in self.machines]
            for machine_id in ids:
                self.machines[machine_id]["status"] = "terminated"
                self.wanted_back.discard(machine_id)
            self.ops[op_id] = request_id = f"ret-{next(self._seq)}"
            self.requests[request_id] = ids
        return {"requestId": self.ops[op_id], "message": ""}

    _stopMachines = _requestReturnMachines

    def _getRequestStatus(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        out = []
        for ref in doc["requests"]:
            ids = self.requests.get(ref["requestId"])
            if ids is None:
                out.append(
                    {
                        "requestId": ref["requestId"],
                        "status": "complete_with_error",
                        "message": "unknown request",
                        "machines": [],
                    }
                )
                continue
            machines = [
                {
                    "machineId": m["machineId"],
                    "name": m["name"],
                    "result": "succeed",
                    "status": m["status"],
                    "privateIpAddress": m["privateIpAddress"],
                    "launchtime": m["launchtime"],
                    "message": "",
                    "instanceRef": m["instanceRef"],
                    "tags": dict(m["tags"]),
                }
                for m in (self.machines[i] for i in ids)
            ]
            short = self._short.get(ref["requestId"], 0)
            status, message = (
                ("complete_with_error", f"{short} machine(s) failed to launch") if short else ("complete", "")
            )
            out.append({"requestId": ref["requestId"], "status": status, "message": message, "machines": machines})
        return {"requests": out}

    def _getReturnRequests(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        wanted = [self.machines[i] for i in sorted(self.wanted_back) if self.machines[i]["status"] == "running"]
        return {
            "status": "complete",
            "message": "",
            "requests": [{"machine": m["name"], "machineId": m["machineId"], "gracePeriod": 120} for m in wanted],
        }

    def _listMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        want = doc["tags"]
        return {
            "machines": [
                {
                    k: (dict(m[k]) if k == "tags" else m[k])
                    for k in ("machineId", "name", "status", "launchtime", "privateIpAddress", "tags")
                }
                for m in self.machines.values()
                if m["status"] != "terminated" and all(m["tags"].get(k) == v for k, v in want.items())
            ]
        }
