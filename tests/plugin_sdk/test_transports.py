"""The SDK's transports and what they share, driven in-process (byte streams, no process started): typed errors
for anything a caller sends, join tokens scrubbed from every output, a bug answered as provider_error."""

from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from provisionerd.plugin_sdk import calls, lines, oneshot
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.redact import Redactor, join_tokens, scrub

TOKEN = "tok-0123456789abcdef"


class Echo:
    """Answers with its input, quotes the join token in a refusal, and has a bug on ``boom``."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        if action == "slow":
            self.gate.wait(5)
        if action == "refuse":
            raise PluginError("capacity_unavailable", f"no room for {doc['bootstrap'][0]['joinToken']}")
        if action == "boom":
            raise RuntimeError(f"bug with {doc}")
        return {"echo": doc}


def _request(rid: int, action: str) -> bytes:
    doc = {"id": rid, "action": action, "input": {"op_id": "op-1", "bootstrap": [{"joinToken": TOKEN}]}}
    return json.dumps(doc).encode() + b"\n"


def _serve(plugin: Any, data: bytes, **kwargs: Any) -> list[dict[str, Any]]:
    out = io.BytesIO()
    assert lines.serve_lines(lambda: plugin, Redactor(), stdin=io.BytesIO(data), stdout=out, **kwargs) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_lines_transport_answers_every_line_typed_and_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    data = b"".join([_request(1, "ok"), b"not json\n", b"\n", _request(2, "refuse"), _request(3, "boom")])
    answers = {a["id"]: a for a in _serve(Echo(), data + b'{"id": 4}\n' + b"x" * 300 + b"\n", max_line=200)}
    assert answers[1]["result"]["echo"]["bootstrap"] == [{"joinToken": "[REDACTED]"}]
    assert answers[None]["error"]["code"] == "invalid_request"  # the line that is not a request (and id 4's)
    assert answers[2]["error"] == {
        "code": "capacity_unavailable",
        "message": "no room for [REDACTED]",
        "retryable": True,
    }
    assert answers[3]["error"] == {
        "code": "provider_error",
        "message": "internal error: RuntimeError",
        "retryable": False,
    }
    assert set(answers) == {1, 2, 3, None}  # the over-long line is dropped, not answered
    assert TOKEN not in caplog.text and "RuntimeError" in caplog.text  # the traceback is logged, scrubbed
    events = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == calls.EVENTS.name and r.levelname == "INFO"
    ]
    assert {e["outcome"] for e in events} == {"ok", "capacity_unavailable", "internal_error"}
    assert all(e["op_id"] == "op-1" and set(e) <= {"ts", "action", "outcome", "ms", "op_id", "message"} for e in events)


def test_calls_run_in_flight_and_answer_in_completion_order() -> None:
    plugin = Echo()
    data = _request(1, "slow") + _request(2, "ok")

    def release_after_the_fast_answer() -> None:
        threading.Timer(0.2, plugin.gate.set).start()

    release_after_the_fast_answer()
    assert [a["id"] for a in _serve(plugin, data, max_in_flight=4)] == [2, 1]
    plugin.gate.set()
    assert [a["id"] for a in _serve(plugin, data, max_in_flight=1)] == [1, 2]


def test_a_plugin_that_failed_to_load_answers_every_call_with_its_error() -> None:
    def factory() -> Any:
        raise PluginError("provider_error", "no config")

    out = io.BytesIO()
    lines.serve_lines(factory, stdin=io.BytesIO(_request(1, "ok") + _request(2, "ok")), stdout=out)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [a["error"]["message"] for a in answers] == ["no config", "no config"]


def test_oneshot_reads_its_input_and_exits_by_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "in.json"
    good.write_text(json.dumps({"bootstrap": [{"joinToken": TOKEN}]}))
    (tmp_path / "bad.json").write_text("{")
    loads = []

    def factory() -> Echo:
        loads.append(1)
        return Echo()

    assert oneshot.serve_oneshot(factory, "ok", ["-f", str(good)]) == 0
    assert json.loads(capsys.readouterr().out) == {"echo": {"bootstrap": [{"joinToken": "[REDACTED]"}]}}
    assert oneshot.serve_oneshot(factory, "refuse", ["-f", str(good)]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["message"] == "no room for [REDACTED]"
    for argv, words in [
        (["-f", str(tmp_path / "bad.json")], "not JSON"),
        (["-f", str(tmp_path / "missing.json")], "cannot read the input file"),
        (["in.json"], "usage"),
    ]:
        assert oneshot.serve_oneshot(factory, "ok", argv) == 1
        error = json.loads(capsys.readouterr().out)["error"]
        assert error["code"] == "invalid_request" and words in error["message"]
    assert len(loads) == 2  # a call refused for its input never paid for the plugin's set-up


def test_dispatch_refuses_unknown_actions_and_checked_inputs() -> None:
    actions = {"describeProvider": lambda doc: {"ok": True}}
    assert calls.dispatch(actions, "describeProvider", {}) == {"ok": True}
    with pytest.raises(PluginError, match="not supported"):
        calls.dispatch(actions, "stopMachines", {})
    with pytest.raises(PluginError, match="unknown action"):
        calls.dispatch(actions, "nope", {})
    with pytest.raises(PluginError, match="input fails the contract schema: bad"):
        calls.dispatch(actions, "describeProvider", {}, lambda action, doc: ["bad"])


def test_redaction_takes_the_longest_secret_first_and_ignores_short_ones() -> None:
    assert scrub("key abcdefXYZ and abcdef", ["abcdef", "abcdefXYZ", "abc"]) == "key [REDACTED] and [REDACTED]"
    assert scrub("abc", ["abc"]) == "abc"  # too short to be a secret: it would scrub ordinary words

    class Cloud(Redactor):
        SECRET_ENV = ("CLOUD_KEY", "CLOUD_UNSET")

    redactor = Cloud.from_environment({"CLOUD_KEY": "sekrit-value"})
    assert redactor.scrub("sekrit-value and tok-0123456789abcdef", [TOKEN]) == "[REDACTED] and [REDACTED]"
    assert join_tokens({"bootstrap": [{"joinToken": TOKEN}, {"x": 1}, "junk"]}) == [TOKEN]
    assert join_tokens(["not", "a", "dict"]) == []


def test_a_plugin_error_has_a_contract_code() -> None:
    with pytest.raises(ValueError):
        PluginError("oops", "not a contract code")
    assert PluginError("throttled", "slow down", 2.5).document() == {
        "code": "throttled",
        "message": "slow down",
        "retryable": True,
        "retryAfter": 2.5,
    }
    assert PluginError("provider_error", "EC2 5xx", retryable=True).retryable
