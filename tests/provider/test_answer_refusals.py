"""Every refusal of a plugin's answer names the failing JSON path and the rule (issue 15, item 5): in the error,
the WARNING log and the event, through the compiled fast check and through the jsonschema fallback, bounded, and
never repeating a value of the answer (it may be a credential)."""

from __future__ import annotations

import json
import logging
import shutil

import jsonschema
import pytest
import trio

from provisionerd.domain.errors import ProviderAnswerInvalid, ProviderProtocolViolation
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.provider import runtime
from provisionerd.provider.schemas import SCHEMA_DIR, ContractSchemas, schema_problems
from provisionerd.telemetry.events import EventLog

SECRET = "s3cret-AKIA-do-not-echo"


def status_answer(**machine: object) -> dict:
    entry = {"machineId": "m-1", "name": "n-1", "result": "succeed", "status": "running", **machine}
    return {
        "requests": [
            {
                "requestId": "r-1",
                "status": "complete",
                "machines": [{"machineId": "m-0", "name": "n-0", "result": "succeed", "status": "running"}, entry],
            }
        ]
    }


def test_the_fast_path_refusal_names_path_and_rule(caplog):
    schemas = runtime.contract()
    name = "getRequestStatus.output.json"
    assert schemas._fast[name] is not schemas.validator(name).is_valid  # the compiled check decides here
    with caplog.at_level(logging.WARNING, logger="provisionerd.provider.runtime"):
        with pytest.raises(ProviderAnswerInvalid) as caught:
            runtime.check_output("p", "getRequestStatus", status_answer(result=SECRET), lambda s: s)
    error = caught.value
    assert isinstance(error, ProviderProtocolViolation)  # callers that decide on the class are unchanged
    assert error.path == "$.requests[0].machines[1].result"
    assert error.rule == 'enum: must be one of ["executing", "succeed", "fail"]'
    assert str(error) == (
        "provider 'p' getRequestStatus: answer refused at $.requests[0].machines[1].result:"
        ' enum: must be one of ["executing", "succeed", "fail"]'
    )
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "$.requests[0].machines[1].result" in record.getMessage() and "enum:" in record.getMessage()
    assert SECRET not in str(error) and SECRET not in caplog.text


def test_missing_and_mistyped_fields_each_point_at_the_field():
    answer = status_answer(launchtime=SECRET)
    del answer["requests"][0]["machines"][1]["machineId"]
    with pytest.raises(ProviderAnswerInvalid) as caught:
        runtime.check_output("p", "getRequestStatus", answer, lambda s: s)
    assert caught.value.problems == (
        ("$.requests[0].machines[1].machineId", "required: is missing"),
        ("$.requests[0].machines[1].launchtime", 'type: must be of type "integer"'),
    )
    assert SECRET not in str(caught.value)


def test_the_jsonschema_fallback_names_path_and_rule(tmp_path):
    # A schema the compiled check does not support (an unknown keyword) is checked by jsonschema alone.
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, directory)
    path = directory / "getRequestStatus.output.json"
    document = json.loads(path.read_text())
    document["maxProperties"] = 100  # not a keyword fastcheck compiles
    path.write_text(json.dumps(document))
    schemas = ContractSchemas(directory)
    name = "getRequestStatus.output.json"
    assert schemas._fast[name] == schemas.validator(name).is_valid  # the fallback
    violations = schemas.output_violations("getRequestStatus", status_answer(result=SECRET))
    assert violations == [("$.requests[0].machines[1].result", 'enum: must be one of ["executing", "succeed", "fail"]')]


def test_a_fast_refusal_jsonschema_cannot_explain_is_still_a_refusal():
    validator = jsonschema.Draft202012Validator({"type": "object"})
    assert schema_problems(validator, {}) == [
        ("$", "fastcheck: refused by the compiled check (jsonschema found no single rule)")
    ]


def test_paths_and_rules_are_bounded_and_hold_no_value():
    validator = jsonschema.Draft202012Validator(
        {
            "type": "object",
            "properties": {"a": {"type": "string", "pattern": "^x{1,3}$"}},
            "additionalProperties": False,
        }
    )
    long_key = "k" * 10_000
    extra, pattern = schema_problems(validator, {long_key: SECRET, "a": SECRET * 100})
    assert pattern == ("$.a", 'pattern: must match "^x{1,3}$"')
    assert (
        len(extra[0]) == 200 and extra[0].startswith("$.kkk") and extra[1] == "additionalProperties: not allowed here"
    )
    problems = [extra, pattern]
    assert all(SECRET not in path + rule for path, rule in problems)
    many = schema_problems(validator, {f"k{i}": 1 for i in range(1000)})
    assert len(many) == 10


class _Reader:
    """A provider whose templates answer breaks the schema (as the transport reports it)."""

    name = "p"

    async def get_available_templates(self, timeout: float | None = None):
        runtime.check_output(
            "p",
            "getAvailableTemplates",
            {"templates": [{"templateId": "t", "maxNumber": SECRET, "attributes": {}}]},
            lambda s: s,
        )
        raise AssertionError("unreachable")


def test_the_event_names_path_and_rule():
    events = EventLog(keep=10)
    feed = OfferFeed({"p": _Reader()}, events)  # type: ignore[dict-item]

    async def main():
        return await feed.refresh()

    failures = trio.run(main)
    assert isinstance(failures["p"], ProviderAnswerInvalid)
    (event,) = events.of_kind("offers_failed")
    assert event["error"] == "ProviderAnswerInvalid"
    assert event["path"] == "$.templates[0].maxNumber" and event["rule"].startswith("type: must be of type")
    assert "$.templates[0].maxNumber" in event["detail"] and SECRET not in json.dumps(event)
