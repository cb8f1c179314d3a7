"""The persistent transport against real plugin processes (real clock)."""

from __future__ import annotations

import json
import time

import attrs
import pytest
import trio
from persistent_kit import run_with, status

from provisionerd.domain.errors import (
    ProviderCrashed,
    ProviderInputInvalid,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
)
from provisionerd.provider.client import PluginClient
from provisionerd.provider.persistent import Backoff

pytestmark = pytest.mark.process


def test_many_concurrent_calls_with_out_of_order_answers(config):
    async def body(client):
        results: dict[str, list[str]] = {}
        finished: list[str] = []

        async def one(rid):
            out = await status(client, rid)
            results[rid] = [m["machineId"] for m in out["requests"][0]["machines"]]
            finished.append(rid)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "sleep:0.6:slow")
            for i in range(50):
                nursery.start_soon(one, f"ok:fast{i}")
        return results, finished

    results, finished = run_with(config, body)
    assert finished[-1] == "sleep:0.6:slow"  # answered last although sent among the first
    assert len(results) == 51
    for rid, machines in results.items():  # every caller got its own answer
        real = rid.split(":")[-1]
        assert machines == [f"{real}-m0", f"{real}-m1"]


def test_crash_mid_request_fails_pending_calls_and_restarts(config):
    async def body(client):
        errors = []

        async def slow():
            try:
                await status(client, "sleep:5:slow")
            except ProviderCrashed as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(0.3)
            with pytest.raises(ProviderCrashed) as info:
                await status(client, "crash")
        assert "about to crash" in str(info.value) and "exit status 3" in str(info.value)
        assert len(errors) == 1 and errors[0].outcome_unknown
        # Later calls are served by a restarted plugin.
        out = await status(client, "ok:after")
        return out, client.restarts

    out, restarts = run_with(config, body)
    assert out["requests"][0]["requestId"] == "after" and restarts == 1


def test_non_json_line_fails_pending_calls_and_restarts(config):
    async def body(client):
        with pytest.raises(ProviderProtocolViolation, match="not JSON"):
            await status(client, "garbage")
        return await status(client, "ok:again")

    assert run_with(config, body)["requests"][0]["requestId"] == "again"


def test_unknown_id_is_a_protocol_violation(config):
    async def body(client):
        with pytest.raises(ProviderProtocolViolation, match="unknown id"):
            await status(client, "unknown-id")

    run_with(config, body)


def test_oversize_line_is_a_protocol_violation(config):
    async def body(client):
        with pytest.raises(ProviderProtocolViolation, match="exceeds"):
            await status(client, "big")

    run_with(config, body)


def test_timeout_kills_the_group_with_its_grandchild_and_restarts(config, data_dir, h):
    async def body(client):
        started = time.monotonic()
        with pytest.raises(ProviderTimeout):
            await status(client, "hang-with-child", timeout=1.5)
        assert time.monotonic() - started < 5
        grandchild = int((data_dir / "grandchild.pid").read_text())
        with trio.fail_after(5):
            while not h.is_dead(grandchild):  # noqa: ASYNC110 - killed by the supervisor just after the timeout: polls a pid
                await trio.sleep(0.02)
        return await status(client, "ok:later")

    assert run_with(config, body)["requests"][0]["requestId"] == "later"


def test_closing_the_client_kills_the_group(config, data_dir, h):
    async def body(client):
        with trio.move_on_after(1.5):
            await status(client, "hang-with-child")
        return int((data_dir / "grandchild.pid").read_text())

    grandchild = run_with(config, body)
    assert h.is_dead(grandchild)


def test_error_answers_and_bad_outputs_are_typed(config):
    async def body(client):
        with pytest.raises(ProviderRejected) as info:
            await status(client, "reject")
        assert info.value.code == "quota_exceeded"
        with pytest.raises(
            ProviderProtocolViolation, match=r"answer refused at \$\.requests\[0\]\.status: enum: must be one of"
        ):
            await status(client, "bad-output")
        # Neither poisons the stream: the same process answers the next call.
        await status(client, "ok:x")
        return client.restarts

    assert run_with(config, body) == 0


def test_a_launch_time_no_float_holds_is_a_typed_refusal_not_a_crash(config):
    """Valid by the schema (an integer >= 0, no upper bound), yet no float holds 400 digits: the typed client
    refuses the answer (before, the reader raised OverflowError, which no caller expects)."""

    async def body(transport):
        client = PluginClient(transport)
        with pytest.raises(ProviderProtocolViolation, match=r"answer refused at \$: readable: OverflowError"):
            await client.get_request_status(["huge-launch"])
        (answer,) = await client.get_request_status(["ok:x"])  # the same process answers the next call
        assert [m.launch_time for m in answer.machines] == [1700000000.0, 1700000000.0]
        return transport.restarts

    assert run_with(config, body) == 0


def test_bad_input_is_never_sent(config, tmp_path):
    log = tmp_path / "received"
    config = attrs.evolve(config, env={"SCRIPTED_LOG": str(log)})

    async def body(client):
        with pytest.raises(ProviderInputInvalid):
            await client.call("getRequestStatus", {"requests": [{"requestId": ""}]})
        await status(client, "ok:valid")

    run_with(config, body)
    sent = [json.loads(line)["input"]["requests"][0]["requestId"] for line in log.read_text().splitlines()]
    assert sent == ["ok:valid"]


def test_credentials_never_appear_in_errors(tmp_path, make_config, h):
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    config = make_config(
        h.persistent_exe(tmp_path / "p", "scripted.py"), transport="persistent", credentials={"SECRET_KEY": secret}
    )

    async def body(client):
        texts = []
        with pytest.raises(ProviderRejected) as info:
            await status(client, "leak")
        texts.append(str(info.value))
        with pytest.raises(ProviderCrashed) as crash:  # the crash detail carries the stderr tail with the leak
            await status(client, "crash")
        texts.append(str(crash.value))
        return texts

    texts = run_with(config, body)
    assert "***" in texts[0]
    assert all(secret not in t and json.dumps(secret)[1:-1] not in t for t in texts), texts


def test_restart_backoff_grows_and_resets():
    b = Backoff(initial=0.1, factor=2, maximum=1.0, reset_after=10)
    delays = []
    d = None
    for _ in range(6):
        d = b.next_delay(d, lived=0.01)
        delays.append(d)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.next_delay(1.0, lived=10) == 0.1
