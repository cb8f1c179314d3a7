"""EC2 failures become typed error documents, and no secret reaches any output, through real plugin processes.

The plugin fixture's teardown checks every test's recorded output for the fake AWS keys and the join tokens; the
tests here drive the paths most likely to leak (EC2 messages quoting parameters, credential failures).
"""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.process


def _our_instance(ec2, plugin):
    return ec2.run_instances(
        ImageId="ami-0123456789abcdef0",
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "provisionerd:cluster", "Value": plugin.cluster}]}
        ],
    )["Instances"][0]["InstanceId"]


def test_throttling_quota_and_auth_errors_are_mapped(plugin, ec2):
    instance = _our_instance(ec2, plugin)
    doc = plugin.request_input("op-thr", 1)
    token = doc["bootstrap"][0]["joinToken"]
    # EC2 messages sometimes quote what they were sent: make this one quote a secret key and a join token.
    echo = f"Request limit exceeded (key {plugin.secrets[1]}, user data {token})"
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "RequestLimitExceeded",
            "http_status": 503,
            "message": echo,
        },
        {"operation": "StopInstances", "action": "error", "code": "VcpuLimitExceeded", "http_status": 400},
        {"operation": "TerminateInstances", "action": "error", "code": "UnauthorizedOperation", "http_status": 403},
    )
    with plugin.persistent() as p:
        throttled = p.call("requestMachines", doc)["error"]
        quota = p.call("stopMachines", plugin.return_input("stop-q", [instance]))["error"]
        auth = p.call("requestReturnMachines", plugin.return_input("ret-a", [instance]))["error"]
    assert (throttled["code"], throttled["retryable"]) == ("throttled", True)
    assert "RequestLimitExceeded" in throttled["message"] and "[REDACTED]" in throttled["message"]
    assert (quota["code"], quota["retryable"]) == ("quota_exceeded", False)
    assert (auth["code"], auth["retryable"]) == ("auth_failed", False)
    assert "after 0 of 1 batches" in auth["message"]
    assert (
        ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"
    )


def test_instance_limit_is_a_quota_error_on_the_one_shot_transport(plugin):
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "InstanceLimitExceeded",
            "http_status": 400,
            "message": "You have requested more instances than your limit",
        }
    )
    error = plugin.error("requestMachines", plugin.request_input("op-lim", 1))
    assert (error["code"], error["retryable"]) == ("quota_exceeded", False)


def test_unreachable_endpoint_is_a_retryable_provider_error(plugin):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plugin.write_config(endpoint_url=f"http://127.0.0.1:{port}", connect_timeout=2)
    error = plugin.error("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}})
    assert (error["code"], error["retryable"]) == ("provider_error", True)
    assert "unreachable" in error["message"]


def test_missing_credentials_are_an_auth_failure(plugin):
    env = {
        k: v
        for k, v in plugin.env.items()
        if not k.startswith("AWS_")
        or k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED")
    }
    rc, out = plugin.oneshot("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}}, env=env)
    assert rc == 1 and (out["error"]["code"], out["error"]["retryable"]) == ("auth_failed", False)
    # describeProvider needs no credentials and no network.
    rc, out = plugin.oneshot("describeProvider", {}, env=env)
    assert rc == 0 and out["features"]["idempotentRequest"] is True and out["features"]["priceQuotes"] is False


@pytest.mark.parametrize("attempts", [1, 2])
def test_max_attempts_is_the_number_of_calls_the_first_included(plugin, attempts):
    """A capacity error on the wire (``FaultProxy``, HTTP 500 as EC2 sends it) is retried by botocore: exactly
    ``max_attempts`` RunInstances in all (botocore's ``max_attempts`` counts retries only: 1 used to make 2)."""
    from fault_proxy import FaultProxy

    with FaultProxy(plugin.config["endpoint_url"], refuse_types={"c5.xlarge"}) as proxy:
        plugin.write_config(endpoint_url=proxy.url, max_attempts=attempts)
        error = plugin.error("requestMachines", plugin.request_input("op-att", 1))
    assert (error["code"], error["retryable"]) == ("capacity_unavailable", True)
    assert "InsufficientInstanceCapacity" in error["message"]
    assert proxy.refused() == ["c5.xlarge"] * attempts and proxy.forwarded() == []
