"""The pure parts of legacy mode: decisions, counting, return verdicts, status merging and the journal."""

from __future__ import annotations

import json

import pytest

from provisionerd.domain.errors import (
    ConfigError,
    ProviderCrashed,
    ProviderOutcomeUnknown,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnsupported,
)
from provisionerd.provider.legacy.journal import ACCEPTED, CALLING, UNKNOWN, CreateOp, Journal, PluginCall, ReturnOp
from provisionerd.provider.legacy.rules import (
    LEGACY_FEATURES,
    NextStep,
    ReturnVerdict,
    after_request_error,
    fulfilment,
    invisible_classes,
    lacking_guarantees,
    return_verdicts,
)
from provisionerd.provider.legacy.shapes import normalise
from provisionerd.provider.legacy.status import create_entry, return_entry

FULL = {
    "idempotentRequest": True,
    "listMachines": True,
    "stopMachines": False,
    "tags": True,
    "priceQuotes": True,
    "allOrNothing": True,
}


@pytest.mark.parametrize(
    ("error", "features", "step"),
    [
        (ProviderTimeout("p", "requestMachines", "slow"), FULL, NextStep.RETRY_SAME_OP),
        (ProviderCrashed("p", "requestMachines", "died"), FULL, NextStep.RETRY_SAME_OP),
        (ProviderTimeout("p", "requestMachines", "slow"), LEGACY_FEATURES, NextStep.UNKNOWN_OUTCOME),
        (ProviderProtocolViolation("p", "requestMachines", "junk"), LEGACY_FEATURES, NextStep.UNKNOWN_OUTCOME),
        (ProviderTimeout("p", "requestMachines", "slow"), {**FULL, "listMachines": False}, NextStep.UNKNOWN_OUTCOME),
        (ProviderOutcomeUnknown("p", "requestMachines", "x"), FULL, NextStep.UNKNOWN_OUTCOME),
        (
            ProviderRejected("p", "requestMachines", "capacity_unavailable", "none"),
            LEGACY_FEATURES,
            NextStep.RETRY_LATER,
        ),
        (ProviderRejected("p", "requestMachines", "provider_error", "no"), LEGACY_FEATURES, NextStep.FAILED),
        (ProviderUnsupported("p", "requestMachines", "no script"), LEGACY_FEATURES, NextStep.FAILED),
    ],
)
def test_after_request_error(error, features, step):
    assert after_request_error(error, features) is step


def test_invisible_classes_and_lacking_guarantees():
    assert invisible_classes(LEGACY_FEATURES) == ("tagged_unknown", "ghost")
    assert invisible_classes(FULL) == ()
    assert invisible_classes({**FULL, "tags": False}) == ("tagged_unknown",)
    assert lacking_guarantees(FULL, legacy=False) == ()
    names = [g.name for g in lacking_guarantees(LEGACY_FEATURES, legacy=True)]
    assert names[:4] == ["idempotent requestMachines (op_id)", "listMachines", "owner tags", "all-or-nothing requests"]
    assert len(names) == 6


def machine(mid: str, result: str = "succeed", status: str = "running") -> dict:
    return {"machineId": mid, "name": f"h-{mid}", "result": result, "status": status}


def test_fulfilment_counts():
    running = fulfilment(3, {"status": "running", "machines": [machine("a", "executing")]})
    assert not running.finished and running.shortfall == 0 and running.pending == ("a",)
    silent = fulfilment(3, {"status": "complete", "machines": [machine("a"), machine("b")]})
    assert silent.shortfall == 1 and silent.silent_partial
    told = fulfilment(3, {"status": "complete_with_error", "machines": [machine("a"), machine("b", "fail")]})
    assert told.shortfall == 2 and not told.silent_partial and told.failed == ("b",)
    gone = fulfilment(1, {"status": "complete", "machines": [machine("a", status="terminated")]})
    assert gone.shortfall == 1  # a "success" that is already terminated gives no machine
    assert fulfilment(2, {"status": "complete", "machines": [machine("a"), machine("b")]}).shortfall == 0


def test_return_verdicts():
    returned = [
        machine("a", status="terminated"),
        machine("b", status="terminated"),
        machine("c", "executing"),
        machine("d", status="terminated"),
        machine("e", status="terminated"),
    ]
    creates = {
        "a": {"machines": [machine("a", status="terminated")]},
        "b": {"machines": [machine("b")]},  # still running: the claim is false
        "c": {"machines": [machine("c")]},
        "e": {"machines": []},  # no longer listed by its create request: gone
    }
    assert return_verdicts(returned, creates) == {
        "a": ReturnVerdict.CONFIRMED,
        "b": ReturnVerdict.STILL_RUNNING,
        "c": ReturnVerdict.NOT_CLAIMED,
        "d": ReturnVerdict.UNVERIFIABLE,
        "e": ReturnVerdict.CONFIRMED,
    }


def test_normalise_fills_what_lsf_plugins_leave_out():
    assert normalise({"requests": [{"requestId": "r", "status": "running"}]}) == {
        "requests": [{"requestId": "r", "status": "running", "machines": [], "message": ""}]
    }
    assert normalise("junk") == "junk"


def test_create_entry_merges_calls_and_keeps_refs_stable():
    op = CreateOp("op", "t", 2, [PluginCall(["r0"], ACCEPTED, "q0"), PluginCall(["r1"], ACCEPTED, "q1")])
    entries = {
        "q0": {"requestId": "q0", "status": "complete", "message": "", "machines": [machine("m0")]},
        "q1": {"requestId": "q1", "status": "complete", "message": "", "machines": [machine("m1")]},
    }
    entry, changed = create_entry("lsf:op", op, entries)
    assert changed and entry["status"] == "complete"
    assert {m["machineId"]: m["instanceRef"] for m in entry["machines"]} == {"m0": "r0", "m1": "r1"}
    again, changed = create_entry("lsf:op", op, entries)
    assert not changed and again == entry


def test_create_entry_reports_extras_unknown_calls_and_missing_reports():
    op = CreateOp("op", "t", 1, [PluginCall(["r0"], ACCEPTED, "q0")])
    extra = {"q0": {"requestId": "q0", "status": "complete", "message": "", "machines": [machine("m0"), machine("m9")]}}
    entry, _ = create_entry("lsf:op", op, extra)
    assert entry["status"] == "complete_with_error" and "1 machine(s) beyond the ask" in entry["message"]
    assert [m.get("instanceRef") for m in entry["machines"]] == ["r0", None]
    assert create_entry("lsf:op", op, {})[0]["status"] == "running"  # the plugin did not report it: keep polling
    split = CreateOp("op2", "t", 2, [PluginCall(["r0"], ACCEPTED, "q0"), PluginCall(["r1"], UNKNOWN, None, "Timeout")])
    entry, _ = create_entry("lsf:op2", split, {"q0": extra["q0"] | {"machines": [machine("m0")]}})
    assert entry["status"] == "complete_with_error" and "outcome is unknown (Timeout)" in entry["message"]


def test_return_entry_for_a_return_that_never_went_through():
    rop = ReturnOp("op", [{"name": "h", "machineId": "m"}], UNKNOWN, None, "ProviderTimeout")
    entry = return_entry("lsf-return:op", rop, None, {})
    assert entry["status"] == "complete_with_error" and "return again" in entry["message"]


def test_the_journal_survives_a_restart_and_stays_bounded(tmp_path):
    path = tmp_path / "j.json"
    journal = Journal(str(path), max_ops=3)
    for i in range(5):
        journal.creates[f"op{i}"] = CreateOp(f"op{i}", "t", 1, [PluginCall([f"r{i}"], CALLING)])
        journal.save()
    journal.returns["ret"] = ReturnOp("ret", [{"name": "h", "machineId": "m"}])
    journal.save()
    loaded = Journal(str(path), max_ops=3)
    assert list(loaded.creates) == ["op2", "op3", "op4"]  # the oldest dropped
    assert all(op.calls[0].state == UNKNOWN for op in loaded.creates.values())  # died mid-call
    assert loaded.returns["ret"].state == UNKNOWN
    assert len(list(loaded.unknown_creates())) == 3
    assert loaded.describe() == {"creates": 3, "returns": 1, "unknown_outcomes": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["j.json"]  # no temporary file left beside it
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        json.dumps({"creates": [{"op_id": 1}], "returns": []}),
        json.dumps(
            {
                "creates": [
                    {
                        "op_id": "o",
                        "template_id": "t",
                        "count": 1,
                        "machines": {},
                        "calls": [{"refs": [], "state": "odd"}],
                    }
                ],
                "returns": [],
            }
        ),
    ],
)
def test_an_unreadable_journal_is_a_config_error(tmp_path, text):
    path = tmp_path / "j.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="legacy journal"):
        Journal(str(path))
