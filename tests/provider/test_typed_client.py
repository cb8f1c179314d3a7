"""The typed provider boundary: values -> input documents that pass the schema, validated output documents ->
values, and ``PluginClient`` over a transport (the in-memory fake) for every action."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from provisionerd.domain.errors import (
    CapacityUnavailable,
    InvalidRequest,
    ProviderInputInvalid,
    ProviderProtocolViolation,
    Throttled,
)
from provisionerd.domain.model import TAG_INSTANCE, Epoch, Offer, PriceQuote, ProviderMachine
from provisionerd.domain.tokens import instance_refs, issue
from provisionerd.provider import contract
from provisionerd.provider.client import PluginClient, ProviderClient, ProviderReader
from provisionerd.provider.runtime import check_output
from provisionerd.provider.schemas import contract as schemas
from provisionerd.provider.values import (
    Features,
    MachineRef,
    MachineRequest,
    MachineReturn,
    OwnerTags,
    ProviderDescription,
    Reclaim,
    RequestAccepted,
    RequestStatus,
    UnknownOutcome,
    status_for,
)
from provisionerd.telemetry.redaction import Redactor
from provisionerd.testing.fake_provider import FakeProvider

PROPERTIES = settings(max_examples=100, deadline=None)


def run_mock(fn):
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


# --- strategies -------------------------------------------------------------------------------------------------

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=24)
op_ids = st.from_regex(r"\A[A-Za-z0-9._:-]{1,64}\Z")
epochs = st.builds(Epoch, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
owners = st.builds(OwnerTags, names, names, op_ids, epochs)
controllers = st.from_regex(r"\A[a-z0-9.]{1,30}:[0-9]{1,5}\Z")
machine_refs = st.builds(MachineRef, names, st.text(max_size=30))


@st.composite
def machine_requests(draw):
    count = draw(st.integers(1, 5))
    issued = issue(instance_refs(draw(op_ids), count))
    return MachineRequest.of(draw(owners), draw(names), issued, draw(st.lists(controllers, min_size=1, max_size=3)))


tags = st.dictionaries(names, st.text(max_size=40), max_size=4)
launch = st.integers(0, 2**40)
address = st.none() | st.text(max_size=20)
status_machines = st.fixed_dictionaries(
    {"machineId": names, "name": st.text(max_size=20), "result": st.sampled_from(["executing", "succeed", "fail"])},
    optional={
        "status": st.text(max_size=10),
        "privateIpAddress": address,
        "launchtime": launch,
        "message": st.text(max_size=10),
        "instanceRef": st.text(max_size=20),
        "tags": tags,
    },
)
status_documents = st.fixed_dictionaries(
    {
        "requests": st.lists(
            st.fixed_dictionaries(
                {
                    "requestId": names,
                    "status": st.sampled_from(["running", "complete", "complete_with_error"]),
                    "machines": st.lists(status_machines, max_size=3),
                },
                optional={"message": st.text(max_size=10)},
            ),
            max_size=3,
        )
    }
)
listing_documents = st.fixed_dictionaries(
    {
        "machines": st.lists(
            st.fixed_dictionaries(
                {
                    "machineId": names,
                    "name": st.text(max_size=20),
                    "status": st.text(max_size=10),
                    "launchtime": launch,
                    "tags": tags,
                },
                optional={"privateIpAddress": address},
            ),
            max_size=4,
        )
    }
)
attributes = st.dictionaries(
    names,
    st.tuples(st.sampled_from(["String", "Boolean"]), st.text(max_size=10)).map(list)
    | st.from_regex(r"\A-?[0-9]{1,6}(\.[0-9]{1,3})?\Z").map(lambda n: ["Numeric", n]),
    max_size=3,
)
prices = st.fixed_dictionaries(
    {
        "amount": st.floats(0, 1e6, allow_nan=False),
        "currency": st.from_regex(r"\A[A-Z]{3}\Z"),
        "unit": st.just("hour"),
        "source": st.text(max_size=20),
        "timestamp": st.just("2026-01-01T00:00:00Z"),
    }
)
template_documents = st.fixed_dictionaries(
    {
        "templates": st.lists(
            st.fixed_dictionaries(
                {"templateId": names, "maxNumber": st.integers(0, 10**6), "attributes": attributes},
                optional={"price": prices},
            ),
            max_size=4,
        )
    }
)


# --- values -> input documents ----------------------------------------------------------------------------------


@PROPERTIES
@given(machine_requests())
def test_a_machine_request_is_a_valid_input_and_keeps_its_tokens_out_of_repr(request):
    document = contract.request_input(request)
    assert schemas().input_problems("requestMachines", document) == []
    assert document["template"] == {"templateId": request.template_id, "machineCount": request.count}
    assert document["op_id"] == request.op_id == document["tags"]["provisionerd:op"]
    assert document["tags"]["provisionerd:epoch"] == str(request.owner.epoch)
    assert [b["joinToken"] for b in document["bootstrap"]] == [b.join_token for b in request.bootstrap]
    assert not any(b.join_token in repr(request) for b in request.bootstrap)


@PROPERTIES
@given(st.lists(machine_refs, min_size=1, max_size=5), owners)
def test_a_return_is_a_valid_input_of_both_return_actions(machines, owner):
    document = contract.return_input(MachineReturn(tuple(machines), owner))
    assert document["machines"] == [{"name": m.name, "machineId": m.machine_id} for m in machines]
    for action in ("requestReturnMachines", "stopMachines"):
        assert schemas().input_problems(action, document) == []


@PROPERTIES
@given(st.lists(names, min_size=1, max_size=5), st.lists(machine_refs, max_size=5), names, tags)
def test_status_reclaim_and_listing_inputs_are_valid(request_ids, machines, cluster, more):
    assert schemas().input_problems("getRequestStatus", contract.status_input(request_ids)) == []
    assert schemas().input_problems("getReturnRequests", contract.reclaims_input(machines)) == []
    listing = contract.listing_input({**more, **contract.cluster_filter(cluster)})
    assert schemas().input_problems("listMachines", listing) == []
    assert contract.op_filter("c", "p", "op") == {
        "provisionerd:cluster": "c",
        "provisionerd:provider": "p",
        "provisionerd:op": "op",
    }


# --- validated output documents -> values -----------------------------------------------------------------------


@PROPERTIES
@given(status_documents)
def test_every_valid_status_document_reads_into_values(document):
    check_output("p", "getRequestStatus", document, Redactor())
    statuses = contract.read_statuses("p", document)
    assert [s.request_id for s in statuses] == [e["requestId"] for e in document["requests"]]
    for status, entry in zip(statuses, document["requests"], strict=True):
        assert status.final == (entry["status"] != "running") and status.message == entry.get("message", "")
        for machine, raw in zip(status.machines, entry["machines"], strict=True):
            assert (machine.machine_id, machine.name, machine.result) == (raw["machineId"], raw["name"], raw["result"])
            assert machine.launch_time == raw.get("launchtime", 0) and machine.address == (
                raw.get("privateIpAddress") or ""
            )
            # The contract's instanceRef names the bootstrap; the instance tag stands in for it.
            assert machine.instance_ref == (raw.get("instanceRef") or raw.get("tags", {}).get(TAG_INSTANCE, ""))
            assert machine.tags == raw.get("tags", {})


@PROPERTIES
@given(listing_documents)
def test_every_valid_listing_reads_into_live_machines(document):
    check_output("p", "listMachines", document, Redactor())
    machines = [row.machine() for row in contract.read_machines("p", document)]
    assert [m.machine_id for m in machines] == [e["machineId"] for e in document["machines"]]
    for machine, raw in zip(machines, document["machines"], strict=True):
        assert machine.result == "succeed" and machine.launch_time == raw["launchtime"]
        assert machine.instance_ref == raw["tags"].get(TAG_INSTANCE, "") and machine.tags == raw["tags"]


@PROPERTIES
@given(template_documents)
def test_every_valid_template_list_reads_into_offers(document):
    check_output("p", "getAvailableTemplates", document, Redactor())
    offers = contract.read_offers("p", document)
    assert [(o.provider, o.template_id, o.max_number) for o in offers] == [
        ("p", t["templateId"], t["maxNumber"]) for t in document["templates"]
    ]
    assert [o.price is not None for o in offers] == ["price" in t for t in document["templates"]]


def test_a_listed_machine_without_the_instance_tag_keeps_its_instance_ref():
    # The legacy adapter's op listing: no tags at all, the instanceRef of the bootstrap instead.
    entry = {"machineId": "m", "name": "h", "status": "running", "launchtime": 5, "instanceRef": "op/0", "tags": {}}
    (row,) = contract.read_machines("p", {"machines": [entry]})
    assert row.machine() == ProviderMachine("m", "h", "succeed", "running", 5.0, "", "op/0", {})
    tagged = dict(entry, tags={TAG_INSTANCE: "op/1"})
    assert contract.read_machines("p", {"machines": [tagged]})[0].instance_ref == "op/1"


def test_the_small_outputs_read_into_their_values():
    features = {"idempotentRequest": True, "listMachines": True, "stopMachines": False, "tags": True}
    described = contract.read_description(
        "p", {"name": "sim", "version": "1", "contractVersion": 1, "features": {**features, "priceQuotes": False}}
    )
    assert described == ProviderDescription("sim", "1", 1, Features(True, True, False, True, False))
    absent = {"priceQuotes": False, "licensePools": False, "allOrNothing": False, "reclaimsByTags": False}
    assert described.features.as_mapping() == {**features, **absent}
    assert Features.from_mapping({"listMachines": "yes"}) == Features()  # only true is true
    assert contract.read_accepted("p", "requestMachines", {"requestId": "r"}) == RequestAccepted("r", "")
    reclaims = contract.read_reclaims(
        "p", {"requests": [{"machine": "h1", "machineId": "m1", "gracePeriod": 90}, {"machine": "h2"}]}
    )
    assert reclaims == (Reclaim("h1", "m1", 90), Reclaim("h2", "", None))
    statuses = (RequestStatus("a", "running", "", ()), RequestStatus("b", "complete", "", ()))
    assert status_for(statuses, "b") is statuses[1] and status_for(statuses, "c") is None


def test_documents_without_the_shape_are_protocol_violations_not_key_errors():
    with pytest.raises(ProviderProtocolViolation, match=r"listMachines: answer refused at \$: readable: key"):
        contract.read_machines("p", {"machines": [{"machineId": "m"}]})
    with pytest.raises(ProviderProtocolViolation, match="getRequestStatus: answer refused at .*readable"):
        contract.read_statuses("p", {})
    with pytest.raises(ProviderProtocolViolation, match="requestMachines: answer refused at .*key 'requestId'"):
        contract.read_accepted("p", "requestMachines", {"message": "no id"})
    with pytest.raises(ProviderProtocolViolation, match=r"\$\.templates\[0\]: readable: key 'templateId'"):
        contract.read_offers("p", {"templates": [{"maxNumber": 1}]})
    with pytest.raises(ProviderProtocolViolation, match="maxItems"):
        contract.read_offers("p", {"templates": [{"templateId": "x", "maxNumber": 1}] * (contract.MAX_TEMPLATES + 1)})


# --- PluginClient over a transport ------------------------------------------------------------------------------


def test_every_action_through_the_plugin_client():
    fake = FakeProvider("p", {"small": 3}, prices={"small": 0.25})
    client = PluginClient(fake)
    owner = OwnerTags("c1", "p", "op-1", Epoch(2, 7))
    request = MachineRequest.of(owner, "small", issue(instance_refs("op-1", 2)), ["10.0.0.1:7700"])

    async def main():
        description = await client.describe_provider()
        offers = await client.get_available_templates(timeout=5)
        accepted = await client.request_machines(request)
        again = await client.request_machines(request)  # the same op_id: the same request
        (status,) = await client.get_request_status([accepted.request_id])
        listed = await client.list_machines(contract.op_filter("c1", "p", "op-1"))
        fake.reclaim(status.machines[0].machine_id)
        wanted = await client.get_return_requests([MachineRef(m.machine_id, m.name) for m in listed])
        back = MachineReturn((MachineRef(status.machines[1].machine_id, status.machines[1].name),), owner)
        returned = await client.request_return_machines(back)
        stopped = await client.stop_machines(MachineReturn(back.machines, OwnerTags("c1", "p", "op-2", Epoch(2, 7))))
        return description, offers, accepted, again, status, listed, wanted, returned, stopped

    description, offers, accepted, again, status, listed, wanted, returned, stopped = run_mock(main)
    assert description.features == Features(True, True, False, True, True, all_or_nothing=True)
    assert description.name == "p"
    assert offers == (
        Offer(
            "p",
            "small",
            3,
            {"ncpus": ("Numeric", "2")},
            PriceQuote(0.25, "USD", "hour", "fake", "2024-01-01T00:00:00Z"),
        ),
    )
    assert again.request_id == accepted.request_id and status.final and status.request_id == accepted.request_id
    assert [m.instance_ref for m in status.machines] == ["op-1/0", "op-1/1"]
    assert all(m.result == "succeed" and m.tags["provisionerd:op"] == "op-1" for m in status.machines)
    assert {m.machine_id for m in listed} == {m.machine_id for m in status.machines}
    assert wanted == (Reclaim(status.machines[0].name, status.machines[0].machine_id, 120),)
    assert returned.request_id and stopped.request_id
    assert [action for action, _ in fake.calls] == [
        "describeProvider",
        "getAvailableTemplates",
        "requestMachines",
        "requestMachines",
        "getRequestStatus",
        "listMachines",
        "getReturnRequests",
        "requestReturnMachines",
        "stopMachines",
    ]


def test_the_plugin_client_raises_the_transports_typed_errors():
    fake = FakeProvider("p", {"small": 1})
    client = PluginClient(fake)
    owner = OwnerTags("c1", "p", "op-1", Epoch(1, 1))

    async def main():
        with pytest.raises(CapacityUnavailable) as full:
            await client.request_machines(MachineRequest.of(owner, "small", issue(instance_refs("op-1", 2)), ["h:1"]))
        with pytest.raises(InvalidRequest):
            await client.request_machines(MachineRequest.of(owner, "large", issue(instance_refs("op-1", 1)), ["h:1"]))
        fake.fail_next("getAvailableTemplates", Throttled("p", "getAvailableTemplates", "slow down"))
        with pytest.raises(Throttled):
            await client.get_available_templates()
        with pytest.raises(ProviderInputInvalid):  # nothing sent: the transport checks the input
            await client.get_request_status([])
        return full.value

    assert run_mock(main).retryable
    assert [action for action, _ in fake.calls] == ["requestMachines", "requestMachines", "getAvailableTemplates"]


def test_a_plain_transport_knows_nothing_without_a_call():
    fake = FakeProvider("p")
    client = PluginClient(fake)
    assert (client.name, client.legacy, client.known_features, client.unknown_outcomes()) == ("p", False, None, ())
    assert client.transport is fake and "FakeProvider" in repr(client)
    assert isinstance(client, ProviderClient) and not isinstance(fake, ProviderReader)


def test_an_unknown_outcome_record_keeps_the_reports_shape():
    record = {"op_id": "op", "template": "t", "instance_refs": ["op/0"], "detail": "ProviderTimeout: 1s"}
    outcome = UnknownOutcome.from_json(record)
    assert outcome == UnknownOutcome("op", "t", ("op/0",), "ProviderTimeout: 1s") and outcome.as_json() == record
