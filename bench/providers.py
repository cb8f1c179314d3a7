"""Calls per second of the same simulated provider over the one-shot and the persistent transport.

Run from the repository root inside the project's environment::

    python bench/providers.py [--seconds 3] [--in-flight 100] [--oneshot-concurrency 2] [--machines 4]

Both transports share one PRO_DATA_DIR, so they serve the same state: one request of ``--machines`` machines,
created first. Each call is ``getRequestStatus`` of that request (the daemon's hot polling path) and goes through
the full runtime: input validated before sending, output validated on arrival. The validator's own cost is
measured separately. The last line is ``{"oneshot_calls_s": X, "persistent_calls_s": Y, "ratio": Y/X}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import trio

from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import open_persistent_provider
from provisionerd.provider.runtime import ProviderClient, ProviderConfig
from provisionerd.provider.schemas import contract

REPO = Path(__file__).resolve().parents[1]
SIMULATED = REPO / "providers" / "simulated"


async def create_request(client: ProviderClient, machines: int) -> str:
    op_id = "bench-op-1"
    tags = {
        "provisionerd:cluster": "bench",
        "provisionerd:provider": client.name,
        "provisionerd:op": op_id,
        "provisionerd:epoch": "1.1",
    }
    boot = [
        {"instanceRef": f"bench-{i}", "controllers": ["127.0.0.1:7700"], "joinToken": f"bench-token-{i:08d}-xxxxxxxx"}
        for i in range(machines)
    ]
    templates = await client.call("getAvailableTemplates", {})
    template = templates["templates"][0]["templateId"]
    out = await client.call(
        "requestMachines",
        {"template": {"templateId": template, "machineCount": machines}, "op_id": op_id, "tags": tags,
         "bootstrap": boot},
    )
    request = {"requests": [{"requestId": out["requestId"]}]}
    with trio.fail_after(30):
        while (await client.call("getRequestStatus", request))["requests"][0]["status"] == "running":
            await trio.sleep(0.01)
    return str(out["requestId"])


async def measure(client: ProviderClient, request_id: str, seconds: float, concurrency: int) -> tuple[int, float]:
    """Calls completed by ``concurrency`` looping tasks in ``seconds``; (calls, elapsed)."""
    doc = {"requests": [{"requestId": request_id}]}
    done = 0

    async def worker(deadline: float) -> None:
        nonlocal done
        while trio.current_time() < deadline:
            out = await client.call("getRequestStatus", doc)
            assert out["requests"][0]["status"] == "complete"
            done += 1

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker, started + seconds)
    return done, trio.current_time() - started


def validator_cost(document: dict, request_id: str, rounds: int = 2000) -> tuple[float, float, float]:
    """Microseconds per call: our input+output check, and jsonschema alone on the output (for comparison)."""
    schemas = contract()
    doc = {"requests": [{"requestId": request_id}]}
    t = time.perf_counter()
    for _ in range(rounds):
        assert not schemas.input_problems("getRequestStatus", doc)
        assert not schemas.output_problems("getRequestStatus", document)
    ours = (time.perf_counter() - t) / rounds * 1e6
    slow = schemas.validator("getRequestStatus.output.json")
    t = time.perf_counter()
    for _ in range(rounds // 20):
        assert slow.is_valid(document)
    jsonschema_us = (time.perf_counter() - t) / (rounds // 20) * 1e6
    return ours, jsonschema_us, len(json.dumps(document))


async def main(args: argparse.Namespace) -> dict[str, float]:
    data = Path(tempfile.mkdtemp(prefix="provisionerd-bench-"))
    try:
        common = dict(name="simulated", cluster="bench", conf_dir=str(SIMULATED / "conf"), data_dir=str(data))
        persistent_config = ProviderConfig(path=str(SIMULATED / "provider"), transport="persistent", **common)
        oneshot = OneShotProvider(ProviderConfig(path=str(SIMULATED), transport="oneshot", **common))
        async with open_persistent_provider(persistent_config) as persistent:
            request_id = await create_request(persistent, args.machines)
            sample = await persistent.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
            ours, slow, size = validator_cost(sample, request_id)
            print(f"validation (input+output, {args.machines} machines, {size} B): {ours:.1f} us/call "
                  f"(jsonschema alone on the output: {slow:.0f} us)")
            await measure(persistent, request_id, 0.3, args.in_flight)  # warm-up
            cpu = time.process_time()
            p_calls, p_time = await measure(persistent, request_id, args.seconds, args.in_flight)
            cpu_us = (time.process_time() - cpu) / p_calls * 1e6
        o_calls, o_time = await measure(oneshot, request_id, args.seconds, args.oneshot_concurrency)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    o_rate, p_rate = o_calls / o_time, p_calls / p_time
    print(f"one-shot:   {o_calls:6d} calls in {o_time:.2f} s, {args.oneshot_concurrency} at a time: {o_rate:8.1f} calls/s")
    print(f"persistent: {p_calls:6d} calls in {p_time:.2f} s, {args.in_flight} in flight:   {p_rate:8.1f} calls/s")
    print(f"daemon-side CPU per persistent call: {cpu_us:.0f} us (validation included; the plugin runs in its own"
          f" process). Load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return {"oneshot_calls_s": round(o_rate, 1), "persistent_calls_s": round(p_rate, 1), "ratio": round(p_rate / o_rate, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--oneshot-concurrency", type=int, default=2)
    parser.add_argument("--machines", type=int, default=4)
    if not (SIMULATED / "provider").exists():
        sys.exit(f"bench: {SIMULATED} is missing")
    result = trio.run(main, parser.parse_args())
    print(json.dumps(result))
