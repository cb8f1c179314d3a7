"""The in-memory fake keeps the contract (the conformance kit passes it) and runs on trio's MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from provisionerd.domain.errors import (
    CapacityUnavailable,
    ProviderCrashed,
    ProviderInputInvalid,
    ProviderRejected,
    ProviderTimeout,
)
from provisionerd.provider.kit import ALL_OR_NOTHING_ROW, IDEMPOTENT_ROW, RETURN_ROW, ROWS, Kit, KitOptions
from provisionerd.testing.fake_provider import FakeProvider


def run_mock(fn):
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_fake_passes_the_kit_on_the_mock_clock():
    async def main():
        fake = FakeProvider(latency=0.5, prices={"small": 0.1})
        rows = await Kit(fake, KitOptions(timeout=5)).run()
        return rows, trio.current_time()

    rows, elapsed = run_mock(main)
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    assert len(rows) >= 14 and elapsed > 0  # virtual time passed, real time did not


def test_the_kit_reports_injected_failures_by_type():
    async def main():
        fake = FakeProvider()
        fake.fail_next("getRequestStatus", ProviderTimeout("fake", "getRequestStatus", "no answer"))
        fake.fail_next("describeProvider", ProviderCrashed("fake", "describeProvider", "exit 1"))
        return {r.name: r for r in await Kit(fake).run()}

    rows = run_mock(main)
    assert rows["describeProvider is valid and honest"].detail.startswith("ProviderCrashed")
    assert rows["getRequestStatus reaches complete"].detail.startswith("ProviderTimeout")
    # The status timed out, but the listing shows the request's machines: the rows that need them still run.
    assert rows[IDEMPOTENT_ROW].ok, rows[IDEMPOTENT_ROW]
    assert rows["machines carry the owner tags and instanceRef"].detail.startswith("getRequestStatus gave no machines")


def test_the_fake_checks_inputs_and_capacity():
    async def main():
        fake = FakeProvider(templates={"t": 1})
        with pytest.raises(ProviderInputInvalid):
            await fake.call("listMachines", {"tags": {}})
        tags = {
            "provisionerd:cluster": "c",
            "provisionerd:provider": "fake",
            "provisionerd:op": "op1",
            "provisionerd:epoch": "1.1",
        }
        boot = [{"instanceRef": f"r{i}", "controllers": ["h:1"], "joinToken": "t" * 20 + str(i)} for i in range(2)]
        doc = {"template": {"templateId": "t", "machineCount": 2}, "op_id": "op1", "tags": tags, "bootstrap": boot}
        with pytest.raises(ProviderRejected) as info:
            await fake.call("requestMachines", doc)
        assert info.value.code == "capacity_unavailable" and info.value.retryable
        return fake.calls

    calls = run_mock(main)
    assert [a for a, _ in calls] == ["requestMachines"]  # the invalid input never reached the fake


def test_the_checks_stop_at_the_budget_and_say_which_rows_it_cut():
    async def main():
        fake = FakeProvider(latency=0.5)
        rows = await Kit(fake, KitOptions(timeout=5, settle=2, budget=2.2)).run()
        return {r.name: r for r in rows}, trio.current_time()

    rows, elapsed = run_mock(main)
    cut = [r for r in rows.values() if "budget of 2.2 s ran out" in r.detail]
    assert cut and all(not r.ok and r.detail.startswith("not run or not finished") for r in cut)
    assert set(ROWS) <= set(rows)  # every row is reported, reached or not
    assert rows[RETURN_ROW].ok, rows[RETURN_ROW]  # the cleanup runs after the budget, on its own bound
    assert elapsed <= 2.2 + 2 + 2 * 5, elapsed


def test_the_all_or_nothing_row_passes_on_the_fake_and_warns_when_it_cannot_be_provoked():
    async def main(templates):
        return {r.name: r for r in await Kit(FakeProvider(templates=templates)).run()}

    row = run_mock(lambda: main({"small": 10}))[ALL_OR_NOTHING_ROW]
    assert row.ok and not row.warning
    assert row.detail == (
        "11 machines of 'small' (maxNumber + 1), all or nothing -> capacity_unavailable;"
        " listMachines shows no machine of the op"
    )
    rows = run_mock(lambda: main({"huge": 10000}))
    row = rows[ALL_OR_NOTHING_ROW]
    assert row.ok and row.warning, row
    assert row.detail.startswith("cannot be provoked: template 'huge' holds maxNumber 10000"), row
    assert all(r.ok for r in rows.values()), [r for r in rows.values() if not r.ok]


class _RefusesAfterMaking(FakeProvider):
    """Declares allOrNothing, makes one machine of an all-or-nothing request, then refuses it anyway."""

    def _requestMachines(self, doc):
        if not doc.get("allOrNothing"):
            return super()._requestMachines(doc)
        one = {**doc, "template": {**doc["template"], "machineCount": 1}, "bootstrap": doc["bootstrap"][:1]}
        super()._requestMachines(one)
        raise CapacityUnavailable(self.name, "requestMachines", "no room for all")


def test_a_refusal_that_left_a_machine_fails_the_row_and_the_cleanup_returns_it():
    async def main():
        fake = _RefusesAfterMaking()
        rows = {r.name: r for r in await Kit(fake).run()}
        return rows, [m for m in fake.machines.values() if m["status"] == "running"]

    rows, running = run_mock(main)
    row = rows[ALL_OR_NOTHING_ROW]
    assert not row.ok
    assert row.detail.startswith(
        "11 machines of 'small' (maxNumber + 1), all or nothing -> capacity_unavailable, yet listMachines shows 1"
        " machines of the op: m-"
    ), row
    assert rows[RETURN_ROW].ok and running == [], rows[RETURN_ROW]
