"""A template's capability probes against the EC2 emulator, through the plugin's real process (issue 35, item 1):
each launched instance's user-data, read back from EC2, holds the template's probes in its ``provisionerd`` part
whatever the request's ``userData`` says; a bad probe config is a ``provider_error`` naming it."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.process

PROBES = {"gputype": "nvidia-smi --query-gpu=name --format=csv,noheader | head -1"}


def gpu_template(**changes: Any) -> dict[str, Any]:
    return {
        "templateId": "g5",
        "instanceType": "g5.xlarge",
        "imageId": "ami-0123456789abcdef0",
        "maxNumber": 4,
        "attributes": {"ngpus": ["Numeric", "1"], "gputype": ["String", "NVIDIA A10G"]},
        "probes": PROBES,
        "reprobeInterval": 120,
        **changes,
    }


@pytest.mark.parametrize("join", ["token", "address-bound"])
def test_each_instances_user_data_holds_the_templates_probes_not_the_requests(plugin: Any, ec2: Any, join: str):
    plugin.write_config(templates=[gpu_template(join=join)])
    doc = plugin.request_input(f"op-probes-{join}", 2, template="g5")
    doc["userData"] = {"provisionerd": {"probes": {"gputype": "echo H100"}}, "probes": {"evil": "true"}}
    with plugin.persistent() as p:
        assert "result" in p.call("requestMachines", doc)
    instances = plugin.instances(ec2, **{"provisionerd:op": doc["op_id"]})
    assert len(instances) == 2
    for instance in instances:
        data = plugin.user_data(ec2, instance["InstanceId"])
        assert data["provisionerd"]["probes"] == PROBES and data["provisionerd"]["reprobeInterval"] == 120
        assert data["userData"] == doc["userData"]  # passed through beside it, never read by the boot script


def test_a_bad_probe_config_is_a_provider_error_naming_the_probe(plugin: Any) -> None:
    plugin.write_config(templates=[gpu_template(probes={"ngpus": "nvidia-smi -L\nwc -l"})])
    error = plugin.error("getAvailableTemplates", {})
    assert error["code"] == "provider_error"
    assert "template 'g5': probes.ngpus: the command must be one line" in error["message"]
