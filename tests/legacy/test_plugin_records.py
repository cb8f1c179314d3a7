"""A call whose outcome stays unknown: the orphan report names the plugin's own records the journal does not account
for (a state-file reader for a known layout, awsv2 first), or says exactly what it cannot see (issue 19 item 3)."""

from __future__ import annotations

import json

import pytest

from provisionerd.domain.errors import ConfigError
from provisionerd.orphans.report import render_table
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.journal import ACCEPTED, UNKNOWN, CreateOp, PluginCall
from provisionerd.provider.legacy.state_files import read_awsv2
from provisionerd.provider.legacy.wiring import legacy_settings
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.values import UnknownOutcome

# The awsv2 layout as its plugin writes it (aws-db.json in PRO_DATA_DIR; a record we wrote, not a copy of theirs).
AWS_DB = {
    "requests": [
        {
            "time": 1796130000000,
            "machines": [{"machineId": "i-0aaa", "name": "ip-10-0-0-5", "status": "running", "result": "succeed"}],
            "requestId": "req-known",
            "templateId": "aws-small",
            "rc_account": "default",
            "hostAllocationType": "onDemand",
        },
        {
            "time": 1796130060000,
            "machines": [
                {
                    "machineId": "i-0bbb",
                    "name": "ip-10-0-0-6",
                    "status": "running",
                    "result": "succeed",
                    "privateIpAddress": "10.0.0.6",
                    "retId": "",
                }
            ],
            "requestId": "req-lost",
            "templateId": "aws-small",
            "rc_account": "default",
        },
        {"requestId": "req-other-template", "templateId": "aws-large", "machines": []},
        {"no": "requestId"},
    ]
}


def adapter(world, state_file: str = "", lost: int = 1) -> LegacyProvider:
    """``lost``: the machines the lost call asked for (2: no request of the state files fits it, so it stays an
    unknown outcome for the report; 1: the one left request does, ``legacy.attribution``)."""
    client = LegacyProvider(
        OneShotProvider(world.config()), LegacySettings(journal_path=str(world.journal), state_file=state_file)
    )
    # One op the plugin answered (req-known), one whose call's outcome is unknown (the daemon died mid-call).
    client.journal.creates["op-ok"] = CreateOp(
        "op-ok", "aws-small", 1, [PluginCall(["op-ok/0"], ACCEPTED, "req-known")]
    )
    refs = [f"op-lost/{i}" for i in range(lost)]
    client.journal.creates["op-lost"] = CreateOp(
        "op-lost", "aws-small", lost, [PluginCall(refs, UNKNOWN, None, "the daemon stopped during the call")]
    )
    return client


def test_the_awsv2_state_file_names_the_request_the_journal_cannot_account_for(world):
    (world.data / "aws-db.json").write_text(json.dumps(AWS_DB))
    (found,) = adapter(world, "awsv2", lost=2).unknown_outcomes()
    assert found["op_id"] == "op-lost"
    assert found["records_from"] == str(world.data / "aws-db.json")
    assert [r["requestId"] for r in found["plugin_records"]] == ["req-lost"]  # not the known one, not aws-large
    assert found["plugin_records"][0]["machines"] == [
        {"machineId": "i-0bbb", "name": "ip-10-0-0-6", "status": "running", "privateIpAddress": "10.0.0.6",
         "returning": False}
    ]  # fmt: skip
    # Through the typed value and into the table the operator reads.
    value = UnknownOutcome.from_json(found).as_json()
    assert value["plugin_records"] == found["plugin_records"]
    table = render_table([], 0, invisible={"lsfex": ("tagged_unknown", "ghost")}, unknown={"lsfex": [value]})
    assert "records request req-lost (template aws-small) the journal does not know: i-0bbb (running)" in table


def test_without_a_reader_the_report_says_which_machines_it_cannot_see(world):
    (found,) = adapter(world).unknown_outcomes()
    assert "plugin_records" not in found
    assert found["cannot_see"].startswith("the machines made for op-lost/0 (template aws-small)")
    assert "state_file" in found["cannot_see"] and "awsv2" in found["cannot_see"]
    table = render_table([], 0, invisible={"lsfex": ("ghost",)}, unknown={"lsfex": [found]})
    assert "cannot see the machines made for op-lost/0" in table


def test_a_missing_or_garbled_state_file_is_said_not_taken_for_nothing(world):
    (found,) = adapter(world, "awsv2").unknown_outcomes()
    assert "aws-db.json does not exist" in found["cannot_see"]
    (world.data / "aws-db.json").write_text("{not json")
    assert "unreadable" in read_awsv2(str(world.data)).problem
    (world.data / "aws-db.json").write_text('{"machines": []}')
    assert "not the awsv2 layout" in read_awsv2(str(world.data)).problem
    (world.data / "aws-db.json").write_text(json.dumps(AWS_DB))
    assert read_awsv2(str(world.data)).skipped == 1


def test_an_unknown_layout_is_a_config_error():
    assert legacy_settings({"state_file": "awsv2"}).state_file == "awsv2"
    with pytest.raises(ConfigError) as caught:
        legacy_settings({"state_file": "azure"})
    assert "state_file: unknown layout 'azure'" in caught.value.problems[0]


def test_the_shipped_example_state_file_names_a_request_a_killed_call_left(world):
    """bench/restarts.py killed the example plugin after it made its machine and before it answered: the op's
    outcome is unknown and the machine had no fact. With ``state_file = "lsfexample"`` the report names it."""
    state = {
        "next": 3,
        "machines": {
            "lsfex-000001": {"name": "h1", "ip": "10.200.0.1", "template": "aws-small", "status": "running",
                             "launchtime": 1796460895},
            "lsfex-000002": {"name": "h2", "ip": "10.200.0.2", "template": "aws-small", "status": "pending",
                             "launchtime": 1796460900},
        },
        "requests": {
            "req-known": {"kind": "create", "machines": ["lsfex-000001"], "polls": 2},
            "req-left": {"kind": "create", "machines": ["lsfex-000002"], "polls": 0},
            "ret-1": {"kind": "return", "machines": ["lsfex-000001"]},
            "bad": {"kind": "create", "machines": "not a list"},
        },
    }  # fmt: skip
    (world.data / "lsfexample-state.json").write_text(json.dumps(state))
    (found,) = adapter(world, "lsfexample", lost=2).unknown_outcomes()
    assert found["records_from"] == str(world.data / "lsfexample-state.json")
    assert [r["requestId"] for r in found["plugin_records"]] == ["req-left"]
    assert found["plugin_records"][0] == {
        "requestId": "req-left",
        "templateId": "aws-small",
        "time": 1796460900000,
        "machines": [{"machineId": "lsfex-000002", "name": "h2", "status": "pending",
                      "privateIpAddress": "10.200.0.2", "returning": False}],
    }  # fmt: skip


def test_the_one_request_only_the_lost_call_can_have_made_is_taken_as_its_answer(world):
    """A daemon stopped mid-call leaves the call unknown in its journal; the plugin's state file holds one request
    of that template and size that no answered call gave (``legacy.attribution``): it is the call's answer, so the
    op is polled as usual instead of failed with its machine left without a fact."""
    (world.data / "aws-db.json").write_text(json.dumps(AWS_DB))
    client = adapter(world, "awsv2", lost=1)
    assert client.unknown_outcomes() == []
    (call,) = client.journal.creates["op-lost"].calls
    assert (call.state, call.request_id) == (ACCEPTED, "req-lost") and "made by nothing else" in call.detail
