"""The typed client over the legacy LSF adapter: what it knows without a call (legacy, features, the journal's
unknown outcomes), a request and its op listing as values, and a lost call typed as an unknown outcome."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from rigs import wait

from provisionerd.domain.errors import OutcomeUnknown, ProviderOutcomeUnknown, ProviderTimeout, ProviderUnsupported
from provisionerd.domain.model import Epoch
from provisionerd.domain.tokens import instance_refs, issue
from provisionerd.provider.client import PluginClient
from provisionerd.provider.contract import cluster_filter, op_filter
from provisionerd.provider.legacy.rules import LEGACY_FEATURES
from provisionerd.provider.values import Features, MachineRequest, OwnerTags, UnknownOutcome

pytestmark = pytest.mark.process

TEMPLATE = "lsfex-small"


def ask(op_id: str, count: int) -> MachineRequest:
    owner = OwnerTags("c1", "lsfex", op_id, Epoch(1, 1))
    return MachineRequest.of(owner, TEMPLATE, issue(instance_refs(op_id, count)), ["10.0.0.5:7700"])


def test_the_adapter_says_what_it_cannot_do_without_calling_the_plugin(world):
    client = PluginClient(world.adapter())
    assert isinstance(client, PluginClient) and client.legacy
    assert client.known_features == Features() == Features.from_mapping(LEGACY_FEATURES)
    assert client.unknown_outcomes() == ()

    async def main():
        description = await client.describe_provider()
        with pytest.raises(ProviderUnsupported, match="cannot list machines"):
            await client.list_machines(cluster_filter("c1"))
        return description

    description = trio.run(main)
    assert description.features == Features() and description.version == "legacy"
    assert world.inputs() == []  # the adapter answered both itself


def test_a_legacy_request_and_its_op_listing_are_values(world):
    client = PluginClient(world.adapter())
    request = ask("op-1", 2)

    async def main():
        accepted = await client.request_machines(request)

        async def final() -> Any:
            (status,) = await client.get_request_status([accepted.request_id])
            return status if status.final else None

        status = await wait.until(f"request {accepted.request_id} final", final, 30)
        return accepted, status, await client.list_machines(op_filter("c1", "lsfex", "op-1"))

    accepted, status, listed = trio.run(main)
    assert accepted.request_id == "lsf:op-1" and status.status == "complete"
    refs = [b.instance_ref for b in request.bootstrap]
    assert sorted(m.instance_ref for m in status.machines) == refs
    # The op listing has no tags (a legacy machine carries none): the bootstrap's ref comes from instanceRef.
    assert sorted(m.instance_ref for m in listed) == refs and all(m.tags == {} for m in listed)
    assert {m.machine_id for m in listed} == {m.machine_id for m in status.machines}


def test_a_lost_call_is_an_unknown_outcome_recorded_in_the_journal(world):
    world.settings({"SLOW_REQUEST_SECONDS": 60})
    client = PluginClient(world.adapter(timeouts={"requestMachines": 1.0}))

    async def main():
        with pytest.raises(ProviderTimeout) as lost:
            await client.request_machines(ask("op-1", 1))
        with pytest.raises(ProviderOutcomeUnknown) as refused:  # never sent again
            await client.request_machines(ask("op-1", 1))
        return lost.value, refused.value

    lost, refused = trio.run(main)
    assert isinstance(lost, OutcomeUnknown) and isinstance(refused, OutcomeUnknown) and refused.outcome_unknown
    (unknown,) = client.unknown_outcomes()
    assert isinstance(unknown, UnknownOutcome) and (unknown.op_id, unknown.template_id) == ("op-1", TEMPLATE)
    assert unknown.instance_refs == ("op-1/0",) and unknown.detail.startswith("ProviderTimeout")
    assert len(world.inputs("requestMachines")) == 1


def test_an_op_the_journal_never_recorded_lists_empty_unless_the_journal_dropped_ops(world):
    """bench/restarts.py (legacy): a daemon killed between its intent and the plugin call left an op the journal
    never recorded, so its plugin never ran; the listing was refused ("not in the legacy journal") at every recovery
    and the demand stayed unmet (3 wanted, 0 running for 240 s). The journal records every op before its plugin runs,
    so such an op made nothing: its listing is empty. Once the journal has dropped ops (at ``max_ops``), it cannot
    say so and the listing is refused as before."""
    adapter = world.adapter()
    client = PluginClient(adapter)

    async def main() -> tuple[Any, Any]:
        with pytest.raises(ProviderUnsupported):  # an empty journal (a new or lost file) cannot say "never called"
            await client.list_machines(op_filter("c1", "lsfex", "op-never-called"))
        await client.request_machines(ask("op-1", 1))  # the journal has a history now
        listed = await client.list_machines(op_filter("c1", "lsfex", "op-never-called"))
        adapter.journal.max_ops = len(adapter.journal.creates)  # as full as it gets: older ops may be gone
        try:
            await client.list_machines(op_filter("c1", "lsfex", "op-never-called"))
        except ProviderUnsupported as exc:
            return listed, exc
        return listed, None

    listed, refused = trio.run(main)
    assert listed == () and len(world.inputs("requestMachines")) == 1
    assert refused is not None and "not in the legacy journal" in str(refused)
