"""A machine's own instance type and quote (issue 34 item 3: a template may list several instance types): read from
``getRequestStatus``, checked by the schema, and recorded in the instance fact instead of the intent's quote."""

from __future__ import annotations

import hashlib

import attrs
import pytest
import trio
import trio.testing

from provisionerd.domain.errors import ProviderAnswerInvalid
from provisionerd.domain.model import NO_EPOCH, CommittedFact, Epoch, InstanceFact, PriceQuote, RequestIntent
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.values import ExecutorSettings
from provisionerd.planner.fact_view import fold
from provisionerd.provider.contract import read_statuses
from provisionerd.provider.runtime import check_output
from provisionerd.telemetry.events import EventLog
from provisionerd.wire import codec
from provisionerd.wire.messages import FactCommit

OFFERED = PriceQuote(0.5, "USD", "hour", "configured", "2026-01-01T00:00:00Z")
QUOTE = {"amount": 0.2, "currency": "USD", "unit": "hour", "source": "configured", "timestamp": "2026-01-01T00:00:00Z"}


def status(**machine: object) -> dict[str, object]:
    entry = {"machineId": "i-1", "name": "n1", "result": "succeed", "status": "running", "instanceRef": "op-1/0"}
    return {"requests": [{"requestId": "r1", "status": "complete", "message": "", "machines": [{**entry, **machine}]}]}


def test_the_type_and_quote_a_machine_really_got_are_read() -> None:
    document = status(instanceType="m5.large", price=QUOTE)
    check_output("p", "getRequestStatus", document, str)
    (machine,) = read_statuses("p", document)[0].machines
    assert machine.instance_type == "m5.large"
    assert machine.price == PriceQuote(0.2, "USD", "hour", "configured", "2026-01-01T00:00:00Z")
    (plain,) = read_statuses("p", status())[0].machines
    assert plain.instance_type == "" and plain.price is None


@pytest.mark.parametrize("price", [{"amount": "cheap"}, {"amount": 1.0}, 3])
def test_a_malformed_quote_is_a_typed_refusal(price: object) -> None:
    with pytest.raises(ProviderAnswerInvalid):
        check_output("p", "getRequestStatus", status(price=price), str)
    with pytest.raises(ProviderAnswerInvalid):
        read_statuses("p", status(price=price))  # past the schema (a transport that skipped it), the reader too


class Facts:
    def __init__(self) -> None:
        self.committed: list[object] = []

    def view(self) -> None:
        return None

    async def commit(self, fact: object) -> int:
        self.committed.append(fact)
        return len(self.committed)


def test_the_instance_fact_records_the_machines_own_quote_else_the_intents() -> None:
    refs = ("op-1/0", "op-1/1")
    hashes = tuple(hashlib.sha256(r.encode()).hexdigest() for r in refs)
    intent = RequestIntent("p", NO_EPOCH, "op-1", "t", 2, refs, hashes, price=OFFERED)
    (own,) = read_statuses("p", status(price=QUOTE, instanceType="m5.large"))[0].machines
    (plain,) = read_statuses("p", status(machineId="i-2", instanceRef="op-1/1"))[0].machines
    facts = Facts()
    steps = Steps(
        FlowDeps(ExecutorSettings(cluster="c", controllers=("ctl:1",)), {}, None, facts, EventLog(None), lambda: 0.0)
    )  # type: ignore[arg-type]

    async def main() -> tuple[str, ...] | None:
        return await steps.commit_instances(intent, [own, plain])

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == ("i-1", "i-2")
    prices = {f.machine_id: f.price for f in facts.committed}  # type: ignore[attr-defined]
    assert prices == {"i-1": PriceQuote(0.2, "USD", "hour", "configured", "2026-01-01T00:00:00Z"), "i-2": OFFERED}
    types = {f.machine_id: f.instance_type for f in facts.committed}  # type: ignore[attr-defined]
    assert types == {"i-1": "m5.large", "i-2": ""}  # the type it really got, when the plugin says


def test_the_instance_type_travels_in_the_fact_and_into_the_view() -> None:
    """Over the wire (protocol ``InstanceFact.instanceType @8``) and folded into the machine's record, which
    ``provisionerd machines`` shows; a frame from a daemon without the field reads ``""``."""
    fact = InstanceFact("p", Epoch(1, 1), "op-1", "op-1/0", "i-1", "t", "0" * 64, instance_type="c5.xlarge")
    assert codec.decode(codec.encode(FactCommit(fact), 7)).msg.fact.instance_type == "c5.xlarge"
    older = FactCommit(attrs.evolve(fact, instance_type=""))
    assert codec.decode(codec.encode(older, 7)).msg.fact.instance_type == ""
    view = fold(
        [
            CommittedFact(1, RequestIntent("p", Epoch(1, 1), "op-1", "t", 1, ("op-1/0",), ("0" * 64,))),
            CommittedFact(2, fact),
        ]
    )
    assert view.machines["i-1"].instance_type == "c5.xlarge"
