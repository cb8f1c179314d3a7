"""The plugin's pure parts, in process: error mapping, config checks, input checks, status and reclaim rules."""

from __future__ import annotations

import datetime
import itertools
import json
from pathlib import Path

import botocore.exceptions
import pytest
from aws_ec2_plugin import bootstrap, machines
from aws_ec2_plugin.config import Config
from aws_ec2_plugin.failures import PluginError, classify_aws_code, from_exception
from aws_ec2_plugin.inputs import create_request, machine_ids, request_ids, tag_filter
from aws_ec2_plugin.plugin import Plugin
from aws_ec2_plugin.records import Records
from aws_ec2_plugin.redact import Redactor

from provisionerd.plugin_sdk.config import ConfigInvalid

CONFIG = {
    "region": "eu-west-1",
    "templates": [
        {
            "templateId": "t",
            "instanceType": "m5.large",
            "imageId": "ami-0123456789abcdef0",
            "maxNumber": 4,
            "attributes": {"ncpus": ["Numeric", "2"]},
        }
    ],
}


@pytest.mark.parametrize(
    ("aws_code", "status", "expected"),
    [
        ("InsufficientInstanceCapacity", 500, ("capacity_unavailable", True)),
        ("InsufficientHostCapacity", 500, ("capacity_unavailable", True)),
        ("RequestLimitExceeded", 503, ("throttled", True)),
        ("InstanceLimitExceeded", 400, ("quota_exceeded", False)),
        ("VcpuLimitExceeded", 400, ("quota_exceeded", False)),
        ("AuthFailure", 401, ("auth_failed", False)),
        ("UnauthorizedOperation", 403, ("auth_failed", False)),
        ("InvalidClientTokenId", 403, ("auth_failed", False)),
        ("InvalidParameterValue", 400, ("invalid_request", False)),
        ("InvalidAMIID.NotFound", 400, ("invalid_request", False)),
        ("MissingParameter", 400, ("invalid_request", False)),
        ("IdempotentParameterMismatch", 400, ("provider_error", True)),
        ("InternalError", 500, ("provider_error", True)),
        ("SomethingNew", 400, ("provider_error", False)),
    ],
)
def test_ec2_error_codes_map_to_contract_codes(aws_code, status, expected):
    assert classify_aws_code(aws_code, status) == expected
    exc = botocore.exceptions.ClientError(
        {"Error": {"Code": aws_code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "RunInstances"
    )
    err = from_exception(exc, "RunInstances")
    assert (err.code, err.retryable, err.aws_code) == (*expected, aws_code)


def test_client_side_failures_map_without_quoting_parameters():
    unreachable = from_exception(botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), "X")
    assert (unreachable.code, unreachable.retryable) == ("provider_error", True)
    timeout = from_exception(botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), "X")
    assert timeout.retryable and "same op_id is safe" in timeout.message
    assert from_exception(botocore.exceptions.NoCredentialsError(), "X").code == "auth_failed"
    param = from_exception(botocore.exceptions.ParamValidationError(report="UserData value JOIN-SECRET"), "X")
    assert param.code == "invalid_request" and "JOIN-SECRET" not in param.message


def test_config_refuses_credentials_and_lists_problems_with_paths():
    with pytest.raises(ConfigInvalid) as caught:
        Config.from_document({**CONFIG, "aws_secret_access_key": "s3cr3t-value-xyz"})
    assert "credentials do not belong" in caught.value.message and "s3cr3t-value-xyz" not in caught.value.message
    assert caught.value.code == "provider_error"
    with pytest.raises(ConfigInvalid) as caught:
        Config.from_document({**CONFIG, "terminate_batch_size": 0, "templates": [{"templateId": "x"}]})
    assert "$.terminate_batch_size" in caught.value.message and "$.templates[0]" in caught.value.message


def test_prices_need_a_source_and_a_date():
    priced = {**CONFIG["templates"][0], "price": {"amount": 0.1, "currency": "USD", "unit": "hour"}}
    with pytest.raises(ConfigInvalid) as caught:
        Config.from_document({**CONFIG, "templates": [priced]})
    assert "source" in caught.value.message
    priced["price"].update(source="operator's contract, p. 4", timestamp="2025-01-31T00:00:00Z")
    config = Config.from_document({**CONFIG, "templates": [priced]})
    assert config.has_prices and config.templates["t"].as_contract()["price"]["source"] == "operator's contract, p. 4"
    assert not Config.from_document(CONFIG).has_prices


def _request(**changes):
    tags = {
        "provisionerd:cluster": "c",
        "provisionerd:provider": "p",
        "provisionerd:op": "op1",
        "provisionerd:epoch": "1.2",
    }
    doc = {
        "template": {"templateId": "t", "machineCount": 1},
        "op_id": "op1",
        "tags": tags,
        "bootstrap": [{"instanceRef": "r", "controllers": ["h:1"], "joinToken": "SECRET-TOKEN-0123456789"}],
    }
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"op_id": "op 1"}, "op_id"),
        ({"template": {"templateId": "t", "machineCount": 5}}, "maxNumber"),
        ({"template": {"templateId": "t", "machineCount": True}}, "machineCount"),
        ({"bootstrap": [{"instanceRef": "r", "controllers": ["h:1"], "joinToken": "short"}]}, "joinToken"),
        (
            {"bootstrap": [{"instanceRef": "r", "controllers": ["no-port"], "joinToken": "SECRET-TOKEN-0123456789"}]},
            "controllers",
        ),
        ({"tags": {"provisionerd:cluster": "c"}}, "lacks"),
    ],
)
def test_bad_request_inputs_are_invalid_requests_that_never_echo_tokens(changes, fragment):
    config = Config.from_document(CONFIG)
    assert create_request(_request(), config, "c").op_id == "op1"
    with pytest.raises(PluginError) as caught:
        create_request(_request(**changes), config, "c")
    assert caught.value.code == "invalid_request" and fragment in caught.value.message
    assert "SECRET-TOKEN" not in caught.value.message


def test_other_inputs_are_checked():
    with pytest.raises(PluginError, match="machineId"):
        machine_ids({"machines": [{"name": "a", "machineId": "vm-1"}]}, required=True)
    with pytest.raises(PluginError, match="machines"):
        machine_ids({"machines": []}, required=True)
    assert machine_ids({"machines": [{"name": "a", "machineId": "i-0123456789abcdef0"}] * 2}, required=True) == [
        "i-0123456789abcdef0"
    ]
    with pytest.raises(PluginError, match="requests"):
        request_ids({"requests": "op-1"})
    with pytest.raises(PluginError, match="never unscoped"):
        tag_filter({"tags": {"provisionerd:op": "x"}})


def test_plugin_rejects_bad_input_before_touching_ec2():
    def no_client(*_):
        raise AssertionError("no EC2 client may be built for a bad input")

    plugin = Plugin(
        Config.from_document(CONFIG),
        Redactor(),
        cluster="c",
        provider_name="aws",
        data_dir=None,
        client_factory=no_client,
    )
    for action, doc in [
        ("getRequestStatus", {"requests": "x"}),
        ("listMachines", {}),
        ("nope", {}),
        (
            "requestReturnMachines",
            {
                "machines": [{"name": "a", "machineId": "i-0123456789abcdef0"}],
                "op_id": "op1",
                "tags": {"provisionerd:cluster": "c"},
            },
        ),
    ]:
        with pytest.raises(PluginError) as caught:
            plugin.handle(action, doc)
        assert caught.value.code == "invalid_request", action
    assert plugin.handle("getAvailableTemplates", {})["templates"][0]["attributes"] == {"ncpus": ["Numeric", "2"]}


def test_client_tokens_are_deterministic_and_within_ec2_limits():
    assert bootstrap.client_token("op-1", 3) == "op-1.3"
    long_token = bootstrap.client_token("x" * 64, 0)
    assert len(long_token) <= 64 and long_token == bootstrap.client_token("x" * 64, 0)
    assert long_token != bootstrap.client_token("x" * 64, 1)


def test_user_data_over_the_ec2_limit_is_refused_without_the_token():
    boot = {"instanceRef": "r", "controllers": ["h:1"], "joinToken": "SECRET-TOKEN-0123456789"}
    with pytest.raises(PluginError) as caught:
        bootstrap.user_data(boot, "c", {"blob": "x" * 20000})
    assert caught.value.code == "invalid_request" and "SECRET-TOKEN" not in caught.value.message


_ids = itertools.count(1)


def _instance(state, tags=(), reason=""):
    return {
        "InstanceId": f"i-{next(_ids):012x}",
        "State": {"Name": state},
        "Tags": [{"Key": k, "Value": v} for k, v in tags],
        "StateReason": {"Message": reason},
        "LaunchTime": datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC),
        "PrivateDnsName": "",
    }


def test_request_states_follow_instance_states():
    assert machines.result_for(machines.CREATE, "pending") == ("executing", "")
    assert machines.result_for(machines.CREATE, "running") == ("succeed", "")
    assert machines.result_for(machines.CREATE, "terminated")[0] == "fail"
    assert machines.result_for(machines.RETURN, "shutting-down") == ("executing", "")
    assert machines.result_for(machines.RETURN, "terminated") == ("succeed", "")
    assert machines.result_for(machines.STOP, "stopped") == ("succeed", "")
    entry = machines.status_machine(machines.CREATE, _instance("terminated", reason="Server.SpotInstanceTermination"))
    assert entry["result"] == "fail" and "SpotInstanceTermination" in entry["message"]
    assert entry["launchtime"] == 1735689600 and entry["name"] == entry["machineId"]
    run = {"result": "succeed"}
    assert machines.request_status([run, {"result": "executing"}], 0) == ("running", "")
    assert machines.request_status([run, run], 0) == ("complete", "")
    assert machines.request_status([run], 1)[0] == "complete_with_error"
    assert machines.unseen_machine(machines.CREATE, "i-1", "r", age=10, grace=300)["result"] == "executing"
    assert machines.unseen_machine(machines.CREATE, "i-1", "r", age=400, grace=300)["result"] == "fail"


def test_reclaims_are_what_we_did_not_ask_for():
    ours_returned = _instance("terminated", (("provisionerd:return-op", "r1"),))
    ours_stopped = _instance("stopped", (("provisionerd:stop-op", "s1"),))
    stopped_then_killed = _instance("terminated", (("provisionerd:stop-op", "s1"),))
    interrupted = _instance("terminated")
    stopped_by_ec2 = _instance("stopped")
    marked = _instance("running", (("provisionerd:reclaim", "45"),))
    marked_no_number = _instance("pending", (("provisionerd:reclaim", "yes"),))
    running = _instance("running")
    wanted = machines.reclaimed(
        [
            ours_returned,
            ours_stopped,
            stopped_then_killed,
            interrupted,
            stopped_by_ec2,
            marked,
            marked_no_number,
            running,
        ],
        "provisionerd:reclaim",
        120,
    )
    assert [(w["machineId"], w["gracePeriod"]) for w in wanted] == [
        (stopped_then_killed["InstanceId"], 0),
        (interrupted["InstanceId"], 0),
        (stopped_by_ec2["InstanceId"], 0),
        (marked["InstanceId"], 45),
        (marked_no_number["InstanceId"], 120),
    ]


def test_redactor_scrubs_environment_secrets_and_call_tokens(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG")
    redactor = Redactor.from_environment()
    text = redactor.scrub("key wJalrXUtnFEMI/K7MDENG token JOIN-abcdef-123", ["JOIN-abcdef-123"])
    assert text == "key [REDACTED] token [REDACTED]"


def test_the_shipped_example_config_is_valid_and_has_no_invented_price():
    example = Path(__file__).resolve().parents[2] / "providers" / "aws_ec2" / "conf.example" / "aws_ec2.json"
    config = Config.from_document(json.loads(example.read_text()))
    assert config.templates and not config.has_prices


def test_records_are_hints_that_survive_damage(tmp_path):
    records = Records(str(tmp_path))
    with records.exclusive("op-1"):
        records.save("op-1", {"kind": "create", "launched": {"r": "i-1"}})
    assert records.load("op-1")["launched"] == {"r": "i-1"}
    assert records.load("op-2") is None
    next((tmp_path / "aws_ec2-requests").glob("*.json")).write_text("{not json")
    assert records.load("op-1") is None  # a damaged hint is no hint
    blocked = tmp_path / "file"
    blocked.write_text("")
    unusable = Records(str(blocked))  # the data dir is a file: no lock file, no records, still no failure
    with unusable.exclusive("op-1"):
        assert unusable.load("op-1") is None
    assert Records(None).load("op-1") is None
