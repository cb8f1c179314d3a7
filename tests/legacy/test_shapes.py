"""What an unmodified LSF plugin receives in legacy mode: exactly the LSF documents, and a join token only when the
operator's userData template asks for one."""

from __future__ import annotations

import json

import pytest
import trio

from provisionerd.domain.errors import ConfigError, ProviderUnsupported
from provisionerd.provider.legacy.rules import UserDataTemplate

pytestmark = pytest.mark.process

#: The LSF resource connector's input documents, key by key.
LSF_KEYS = {
    "getAvailableTemplates": set(),
    "requestMachines": {"template", "rc_account", "userData"},
    "requestReturnMachines": {"machines"},
    "getRequestStatus": {"requests"},
    "getReturnRequests": {"machines"},
}


def assert_lsf_shape(action: str, doc: dict) -> None:
    assert set(doc) == LSF_KEYS[action], (action, doc)
    if action == "requestMachines":
        assert set(doc["template"]) == {"templateId", "machineCount"}
    if action in ("requestReturnMachines", "getReturnRequests"):
        assert all(set(m) == {"name", "machineId"} for m in doc["machines"])
    if action == "getRequestStatus":
        assert all(set(r) == {"requestId"} for r in doc["requests"])


def test_the_whole_lifecycle_sends_only_lsf_shapes(world, h):
    async def main():
        client = world.adapter()
        assert (await client.call("describeProvider", {}))["features"]["listMachines"] is False
        await client.call("getAvailableTemplates", {})
        out = await client.call("requestMachines", world.request("op-1", 2))
        entry = await h.settle(client, out["requestId"])
        assert entry["status"] == "complete" and len(entry["machines"]) == 2
        assert sorted(m["instanceRef"] for m in entry["machines"]) == ["op-1/i-0", "op-1/i-1"]
        ret = await client.call("requestReturnMachines", world.return_input("op-2", entry["machines"]))
        done = await h.settle(client, ret["requestId"])
        assert done["status"] == "complete" and {m["result"] for m in done["machines"]} == {"succeed"}
        await client.call("getReturnRequests", {"machines": []})
        with pytest.raises(ProviderUnsupported):
            await client.call("listMachines", {"tags": {"provisionerd:cluster": "c1"}})

    trio.run(main)
    received = world.inputs()
    assert {a for a, _ in received} == set(LSF_KEYS)
    for action, text in received:
        assert_lsf_shape(action, json.loads(text))
        for ours in (
            "op_id",
            "provisionerd:",
            "bootstrap",
            "joinToken",
            "instanceRef",
            "10.0.0.5",
            *world.tokens.values(),
        ):
            assert ours not in text, (action, ours)
    (request,) = [json.loads(t) for a, t in received if a == "requestMachines"]
    assert request == {
        "template": {"templateId": "lsfex-small", "machineCount": 2},
        "rc_account": "default",
        "userData": {},
    }


def test_a_configured_user_data_template_carries_one_token_per_machine(world, h):
    template = {
        "PROVISIONERD_JOIN_TOKEN": "{join_token}",
        "PROVISIONERD_CONTROLLERS": "{controllers}",
        "PROVISIONERD_INSTANCE": "{instance_ref}",
        "SITE": "blue",
    }

    async def main():
        client = world.adapter(template)
        out = await client.call("requestMachines", world.request("op-1", 3))
        return await h.settle(client, out["requestId"])

    entry = trio.run(main)
    assert entry["status"] == "complete" and len(entry["machines"]) == 3
    requests = [json.loads(t) for a, t in world.inputs("requestMachines")]
    assert len(requests) == 3 and all(r["template"]["machineCount"] == 1 for r in requests)  # a token is single-use
    assert all(set(r) == LSF_KEYS["requestMachines"] for r in requests)
    for machine in entry["machines"]:
        # What the machine boots with: its own token, paired with the instanceRef the daemon sees for it.
        ref = machine["instanceRef"]
        assert world.user_data_of(machine["machineId"]) == {
            "PROVISIONERD_JOIN_TOKEN": world.tokens[ref],
            "PROVISIONERD_CONTROLLERS": "10.0.0.5:7700",
            "PROVISIONERD_INSTANCE": ref,
            "SITE": "blue",
        }
    assert len({m["instanceRef"] for m in entry["machines"]}) == 3
    assert not any(token in json.dumps(entry) for token in world.tokens.values())


def test_a_template_without_per_machine_fields_keeps_one_call(world, h):
    async def main():
        client = world.adapter({"CLUSTER": "{cluster}", "OP": "{op_id}"})
        out = await client.call("requestMachines", world.request("op-7", 2))
        return await h.settle(client, out["requestId"])

    assert trio.run(main)["status"] == "complete"
    (request,) = [json.loads(t) for _, t in world.inputs("requestMachines")]
    assert request["template"]["machineCount"] == 2
    assert request["userData"] == {"CLUSTER": "c1", "OP": "op-7"}


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"T": "{token}"}, "unknown placeholder {token}"),
        ({"T": "{join_token.__class__}"}, "unknown placeholder"),
        ({"T": "{join_token!r}"}, "takes no format spec"),
        ({"T": "{join_token"}, "expected '}'"),
        ({"T": 5}, "must be a string"),
    ],
)
def test_bad_user_data_templates_are_config_errors(values, problem):
    with pytest.raises(ConfigError) as caught:
        UserDataTemplate.parse(values)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_user_data_template_properties():
    assert UserDataTemplate.parse({"A": "{cluster}"}).per_machine is False
    assert UserDataTemplate.parse({"A": "{instance_ref}"}).per_machine is True
    assert UserDataTemplate.parse({"A": "{instance_ref}"}).carries_token is False
    assert UserDataTemplate.parse({"A": "x{join_token}y", "B": "{{literal}}"}).carries_token is True
    assert UserDataTemplate.parse({"B": "{{literal}}"}).render({}) == {"B": "{literal}"}
