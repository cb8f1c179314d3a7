"""The SDK's contract values and documents: what a plugin answers is what the contract's schemas accept."""

from __future__ import annotations

import pytest

from provisionerd.plugin_sdk import documents, ids, inputs, values
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.provider.schemas import contract


def test_the_documents_pass_the_contract_schemas() -> None:
    check = contract()
    assert not check.output_problems("describeProvider", documents.describe("p", "1", licensePools=True))
    template = values.Template(
        "t", 3, {"ncpus": ("Numeric", "2")}, values.Price(0.5, "EUR", "list", "2025-01-01T00:00:00Z")
    )
    assert not check.output_problems("getAvailableTemplates", {"templates": [template.to_contract()]})
    tags = {"provisionerd:cluster": "c", values.INSTANCE_TAG: "ref-1"}
    machine = values.Machine("m-1", "m-1", "succeed", "running", 5, "10.0.0.1", tags=tags)
    status = values.RequestStatus("r", "complete", (machine,), "1 running").to_contract()
    assert status["machines"][0]["instanceRef"] == "ref-1"  # from the instance tag
    assert not check.output_problems("getRequestStatus", {"requests": [status, documents.unknown_request("x")]})
    assert not check.output_problems("listMachines", {"machines": [machine.listing_entry()]})


def test_a_request_status_rolls_up_its_machines() -> None:
    assert documents.rollup([]) == "complete"
    assert documents.rollup(["succeed", "fail"]) == "complete_with_error"
    assert documents.rollup(["fail", "executing"]) == "running"
    machines = [{"result": "succeed"}, {"result": "executing"}, {"result": "succeed"}]
    assert documents.result_counts(machines) == "1 executing, 2 succeed"
    assert documents.return_status("r", machines)["message"] == "2 of 3 returned"
    with pytest.raises(ValueError):
        values.Machine("m", "m", result="done")
    with pytest.raises(ValueError):
        values.Template("t", 1, {"x": ("Text", "y")})


def test_request_ids_carry_their_op_id_and_split_back() -> None:
    made = ids.make_request_id("k8s", "ret", "ab12", "op:1.x-y")
    assert made == "k8s-ret@ab12@op:1.x-y" and ids.parse_request_id("k8s", made) == ("ret", "ab12", "op:1.x-y")
    assert ids.parse_request_id("slurm", made) is None and ids.parse_request_id("k8s", "k8s-req@h@") is None
    with pytest.raises(ValueError):
        ids.make_request_id("k8s", "other", "h", "op")


def test_the_asked_template_must_be_offered_and_within_max_number() -> None:
    offered = {"t": values.Template("t", 2)}
    assert inputs.asked_template(offered, {"template": {"templateId": "t", "machineCount": 2}}) == (offered["t"], 2)
    for asked, words in [
        ({"templateId": "u", "machineCount": 1}, "unknown templateId 'u'"),
        ({"templateId": "t", "machineCount": 3}, "maxNumber is 2"),
    ]:
        with pytest.raises(PluginError, match=words) as caught:
            inputs.asked_template(offered, {"template": asked})
        assert caught.value.code == "invalid_request"
