"""The whole contract, run against every plugin we ship: simulated (both transports), bash, Node.js.

Each test drives the plugin as a real subprocess and checks every output against ``schemas/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plugintest_client import (
    BASH_EXAMPLE,
    NODE_EXAMPLE,
    SIMULATED,
    OneShotDriver,
    PersistentDriver,
    request_input,
    return_input,
)
from rigs import backends

PLUGINS = {
    # name: (template, how to start)
    "simulated-oneshot": "sim-cpu-8",
    "simulated-persistent": "sim-cpu-8",
    "bash": "bash-small",
    "node": "node-small",
}


#: Node.js is not the machine's Python: the node example is in the integration tier.
PARAMS = [
    pytest.param(name, marks=pytest.mark.integration if name == "node" else pytest.mark.process)
    for name in sorted(PLUGINS)
]


@pytest.fixture(params=PARAMS)
def plugin(request, env, contract, start_persistent):
    name = request.param
    if name == "node":
        backends.need("node", "Debian: nodejs")
    if name == "simulated-oneshot":
        driver = OneShotDriver(SIMULATED, env, contract)
    elif name == "bash":
        driver = OneShotDriver(BASH_EXAMPLE, env, contract)
    elif name == "simulated-persistent":
        driver = PersistentDriver(start_persistent([SIMULATED / "provider"], env), contract)
    else:
        driver = PersistentDriver(start_persistent([NODE_EXAMPLE / "provider"], env), contract)
    driver.template = PLUGINS[name]
    return driver


def _ok(driver, action, inp):
    good, doc = driver.call(action, inp)
    assert good, doc
    return doc


def _poll(driver, request_id: str, polls: int = 5) -> dict:
    for _ in range(polls):
        (status,) = _ok(driver, "getRequestStatus", {"requests": [{"requestId": request_id}]})["requests"]
        assert status["requestId"] == request_id
        if status["status"] != "running":
            return status
    raise AssertionError(f"request {request_id} still running after {polls} polls: {status}")


def _listed(driver, **tags) -> list[dict]:
    return _ok(driver, "listMachines", {"tags": {"provisionerd:cluster": "c1", **tags}})["machines"]


def test_describe_and_templates(plugin):
    described = _ok(plugin, "describeProvider", {})
    assert described["contractVersion"] == 1
    assert described["features"]["idempotentRequest"] and described["features"]["listMachines"]
    templates = _ok(plugin, "getAvailableTemplates", {})["templates"]
    assert plugin.template in {t["templateId"] for t in templates}


def test_lifecycle_with_tags_listing_and_no_token_leak(plugin, env):
    ask = request_input(plugin.template, 2, "op-create-1")
    accepted = _ok(plugin, "requestMachines", ask)
    status = _poll(plugin, accepted["requestId"])
    assert status["status"] == "complete"
    machines = status["machines"]
    assert [m["result"] for m in machines] == ["succeed", "succeed"]
    assert len({m["machineId"] for m in machines}) == 2
    for machine, boot in zip(machines, ask["bootstrap"], strict=True):
        assert machine["instanceRef"] == boot["instanceRef"]
        assert machine["tags"] == {**ask["tags"], "provisionerd:instance": boot["instanceRef"]}

    listed = _listed(plugin)
    assert {m["machineId"] for m in listed} == {m["machineId"] for m in machines}
    assert all(m["tags"]["provisionerd:op"] == "op-create-1" for m in listed)
    assert len(_listed(plugin, **{"provisionerd:op": "op-create-1"})) == 2
    assert _listed(plugin, **{"provisionerd:op": "some-other-op"}) == []
    assert _ok(plugin, "listMachines", {"tags": {"provisionerd:cluster": "c2"}})["machines"] == []

    returned = _ok(plugin, "requestReturnMachines", return_input(machines[:1], "op-return-1"))
    ret_status = _poll(plugin, returned["requestId"])
    assert ret_status["status"] == "complete"
    assert [(m["machineId"], m["result"], m["status"]) for m in ret_status["machines"]] == [
        (machines[0]["machineId"], "succeed", "terminated")
    ]
    assert [m["machineId"] for m in _listed(plugin)] == [machines[1]["machineId"]]

    # The same return op_id again: the same return request. A new op_id for the same machine: harmless.
    replay = _ok(plugin, "requestReturnMachines", return_input(machines[:1], "op-return-1"))
    assert replay["requestId"] == returned["requestId"]
    again = _ok(plugin, "requestReturnMachines", return_input(machines[:1], "op-return-2"))
    assert again["requestId"] != returned["requestId"]
    assert _poll(plugin, again["requestId"])["machines"][0]["status"] == "terminated"
    assert [m["machineId"] for m in _listed(plugin)] == [machines[1]["machineId"]]
    _assert_no_token_leaks(plugin, env, [b["joinToken"] for b in ask["bootstrap"]])


def _assert_no_token_leaks(plugin, env, tokens):
    """No join token in any output, log or state file: our plugins keep only its SHA-256."""
    if hasattr(plugin, "plugin"):
        plugin.plugin.close()
        plugin.transcript.append(plugin.plugin.proc.stderr.read())
    seen = b"".join(plugin.transcript)
    for path in Path(env["PRO_DATA_DIR"]).rglob("*"):
        if path.is_file():
            seen += path.read_bytes()
    assert not any(token.encode() in seen for token in tokens)


# The simulated provider runs the same engine over both transports; its one-shot side is covered by the lifecycle
# test here and by test_simulated_oneshot.py (which replays an op_id after a crash), so it is left out here.
@pytest.mark.parametrize("plugin", [p for p in PARAMS if p.values[0] != "simulated-oneshot"], indirect=True)
def test_idempotency_typed_errors_and_foreign_machines(plugin):
    ask = request_input(plugin.template, 2, "op-idem")
    first = _ok(plugin, "requestMachines", ask)
    machines = {m["machineId"] for m in _poll(plugin, first["requestId"])["machines"]}
    second = _ok(plugin, "requestMachines", ask)
    assert second["requestId"] == first["requestId"]
    assert {m["machineId"] for m in _poll(plugin, second["requestId"])["machines"]} == machines
    assert {m["machineId"] for m in _listed(plugin)} == machines

    # The same op_id for a different ask is the caller's bug: refused, and nothing new is created.
    good, error = plugin.call("requestMachines", request_input(plugin.template, 1, "op-idem"))
    assert not good and error["code"] == "invalid_request" and "op-idem" in error["message"]
    good, error = plugin.call("requestMachines", request_input("no-such-template", 1, "op-bad"))
    assert not good and (error["code"], error["retryable"]) == ("invalid_request", False)
    assert "no-such-template" in error["message"]
    good, error = plugin.call("requestMachines", {**request_input(plugin.template, 1, "op-x"), "op_id": "bad op/id"})
    assert not good and error["code"] == "invalid_request"
    assert {m["machineId"] for m in _listed(plugin)} == machines
    unknown = _ok(plugin, "getRequestStatus", {"requests": [{"requestId": "req-unknown"}]})["requests"][0]
    assert unknown["status"] == "complete_with_error" and unknown["machines"] == []

    # A machine of another cluster is never returned, whoever asks.
    theirs = _ok(plugin, "requestMachines", request_input(plugin.template, 1, "op-theirs", cluster="other"))
    (machine,) = _poll(plugin, theirs["requestId"])["machines"]
    status = _poll(plugin, _ok(plugin, "requestReturnMachines", return_input([machine], "op-steal"))["requestId"])
    assert status["status"] == "complete_with_error" and status["machines"][0]["result"] == "fail"
    listed = _ok(plugin, "listMachines", {"tags": {"provisionerd:cluster": "other"}})["machines"]
    assert [m["machineId"] for m in listed] == [machine["machineId"]]


def _pages(driver, action, inp, page_size):
    """Every page of ``action`` with ``page_size``, following the plugin's cursors (at most 50 pages)."""
    pages, cursor = [], None
    for _ in range(50):
        paged = {**inp, "pageSize": page_size, **({} if cursor is None else {"cursor": cursor})}
        answer = _ok(driver, action, paged)
        pages.append(answer)
        cursor = answer.get("nextCursor")
        if cursor is None:
            return pages
    raise AssertionError(f"{action}: no last page in 50")


def test_listing_pages_join_up_with_no_duplicate_and_none_missing(plugin):
    accepted = _ok(plugin, "requestMachines", request_input(plugin.template, 5, "op-pages"))
    made = {m["machineId"] for m in _poll(plugin, accepted["requestId"])["machines"]}
    assert {m["machineId"] for m in _listed(plugin)} == made  # without pageSize: everything, one page
    for size in (1, 2, 5, 7):
        pages = _pages(plugin, "listMachines", {"tags": {"provisionerd:cluster": "c1"}}, size)
        ids = [m["machineId"] for page in pages for m in page["machines"]]
        assert sorted(ids) == sorted(made), size  # no duplicate, none missing
        assert all(len(page["machines"]) <= size for page in pages)
        assert len(pages) == -(-5 // size), size  # no empty page after the last
    wanted = _pages(plugin, "getReturnRequests", {"machines": [{"machineId": m, "name": ""} for m in made]}, 2)
    assert all(len(page["requests"]) <= 2 for page in wanted)
