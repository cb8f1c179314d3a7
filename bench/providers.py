"""Calls per second of the same simulated provider over the one-shot and the persistent transport.

Run from the repository root inside the project's environment::

    python bench/providers.py [--seconds 2] [--rounds 3] [--in-flight 100] [--oneshot-concurrency 2] [--machines 4]

Both transports share one PRO_DATA_DIR, so they serve the same state: one request of ``--machines`` machines,
created first. Each call is ``getRequestStatus`` of that request (the daemon's hot polling path) and goes through
the full runtime as the daemon makes it: the typed client (``PluginClient``) writes the input document, the
transport validates it before sending and the output on arrival, and the client reads the output into values. The
validator's own cost is measured separately. The last line is
``{"oneshot_calls_s": X, "persistent_calls_s": Y, "ratio": Y/X}``.

Calls/s depend on how much of a core the daemon gets, so the persistent transport is measured in ``--rounds``
rounds and the median is reported. Its daemon-side CPU per call (user + system time of this process; the plugin
runs in its own) depends much less on other load, and ``1e6 / cpu_us`` is the rate one idle core would sustain.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from provisionerd.domain.model import Epoch
from provisionerd.provider.client import PluginClient, ProviderClient
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import open_persistent_provider
from provisionerd.provider.runtime import ProviderConfig, dump_json
from provisionerd.provider.schemas import contract
from provisionerd.provider.values import Bootstrap, MachineRequest, OwnerTags

REPO = Path(__file__).resolve().parents[1]
SIMULATED = REPO / "providers" / "simulated"


async def create_request(client: ProviderClient, machines: int) -> str:
    op_id = "bench-op-1"
    owner = OwnerTags("bench", client.name, op_id, Epoch(1, 1))
    boot = tuple(Bootstrap(f"bench-{i}", ("127.0.0.1:7700",), f"bench-token-{i:08d}-xxxxxxxx") for i in range(machines))
    offers = await client.get_available_templates()
    accepted = await client.request_machines(MachineRequest(offers[0].template_id, owner, boot))
    with trio.fail_after(30):
        # Polling is the point: the plugin's state has no event to wait on.
        while (await client.get_request_status([accepted.request_id]))[0].status == "running":  # noqa: ASYNC110
            await trio.sleep(0.01)
    return accepted.request_id


async def measure(client: ProviderClient, request_id: str, seconds: float, concurrency: int) -> tuple[int, float]:
    """Calls completed by ``concurrency`` looping tasks in ``seconds``; (calls, elapsed)."""
    ids = [request_id]
    done = 0

    async def worker(deadline: float) -> None:
        nonlocal done
        while trio.current_time() < deadline:
            statuses = await client.get_request_status(ids)
            assert statuses[0].status == "complete"
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


async def pipe_cost(line: bytes, seconds: float, in_flight: int) -> tuple[float, float, float]:
    """The pipe alone, for comparison: ``line`` (an answer line as the plugin writes it) echoed by ``cat``.

    Returns (round trip in us with one line in flight, lines/s and daemon CPU us per line with ``in_flight`` lines
    written at once, as the transport's writer coalesces them, and read back in chunks split into lines)."""
    proc = await trio.lowlevel.open_process(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def echo(batch: bytes, lines: int) -> None:
        await stdin.send_all(batch)
        seen = 0
        while seen < lines:
            seen += (await stdout.receive_some(65536)).count(b"\n")

    try:
        one, n, started = line, 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 2:
            await echo(one, 1)
            n += 1
        round_trip = (time.perf_counter() - started) / n * 1e6
        batch, n, cpu, started = line * in_flight, 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - started < seconds / 2:
            await echo(batch, in_flight)
            n += in_flight
        elapsed = time.perf_counter() - started
        return round_trip, n / elapsed, (time.process_time() - cpu) / n * 1e6
    finally:
        proc.kill()
        await proc.wait()


async def main(args: argparse.Namespace) -> dict[str, float]:
    data = Path(tempfile.mkdtemp(prefix="provisionerd-bench-"))
    print(f"load average at start: {_load()}")
    try:
        common = dict(name="simulated", cluster="bench", conf_dir=str(SIMULATED / "conf"), data_dir=str(data))
        persistent_config = ProviderConfig(path=str(SIMULATED / "provider"), transport="persistent", **common)
        oneshot = PluginClient(OneShotProvider(ProviderConfig(path=str(SIMULATED), transport="oneshot", **common)))
        async with open_persistent_provider(persistent_config) as transport:
            persistent = PluginClient(transport)
            request_id = await create_request(persistent, args.machines)
            sample = await transport.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
            ours, slow, size = validator_cost(sample, request_id)
            print(
                f"validation (input+output, {args.machines} machines, {size} B): {ours:.1f} us/call "
                f"(jsonschema alone on the output: {slow:.0f} us)"
            )
            line = (dump_json({"id": 123456, "result": sample}) + "\n").encode()
            trip, pipe_rate, pipe_cpu = await pipe_cost(line, args.seconds, args.in_flight)
            print(
                f"pipe alone (cat echoing the {len(line)} B answer line): round trip {trip:.1f} us one in flight; "
                f"{pipe_rate:.0f} lines/s, daemon CPU {pipe_cpu:.1f} us/line at {args.in_flight} in flight"
            )
            await measure(persistent, request_id, 0.3, args.in_flight)  # warm-up
            rates, cpus = [], []
            for n in range(1, args.rounds + 1):
                cpu = time.process_time()  # user + system time of the daemon side only
                p_calls, p_time = await measure(persistent, request_id, args.seconds, args.in_flight)
                rates.append(p_calls / p_time)
                cpus.append((time.process_time() - cpu) / p_calls * 1e6)
                print(
                    f"persistent round {n}: {p_calls:6d} calls in {p_time:.2f} s, {args.in_flight} in flight: "
                    f"{rates[-1]:8.1f} calls/s, daemon CPU {cpus[-1]:5.1f} us/call"
                )
        o_calls, o_time = await measure(oneshot, request_id, args.seconds, args.oneshot_concurrency)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    o_rate, p_rate, cpu_us = o_calls / o_time, statistics.median(rates), statistics.median(cpus)
    print(
        f"one-shot:   {o_calls:6d} calls in {o_time:.2f} s, {args.oneshot_concurrency} at a time: {o_rate:8.1f} calls/s"
    )
    print(f"persistent: median of {args.rounds} rounds: {p_rate:8.1f} calls/s")
    print(
        f"daemon-side CPU per persistent call: median {cpu_us:.1f} us, best {min(cpus):.1f} us (validation and JSON "
        f"included; the plugin runs in its own process) = {1e6 / cpu_us:.0f} calls/s on one idle core; "
        f"the pipe alone: {pipe_cpu:.1f} us CPU a line, round trip {trip:.1f} us"
    )
    print(f"load average at end: {_load()} on {os.cpu_count()} CPUs")
    return {
        "oneshot_calls_s": round(o_rate, 1),
        "persistent_calls_s": round(p_rate, 1),
        "ratio": round(p_rate / o_rate, 1),
        "daemon_cpu_us_per_call": round(cpu_us, 1),
        "pipe_cpu_us_per_line": round(pipe_cpu, 1),
        "pipe_round_trip_us": round(trip, 1),
    }


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per round, and for one-shot")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--oneshot-concurrency", type=int, default=2)
    parser.add_argument("--machines", type=int, default=4)
    if not (SIMULATED / "provider").exists():
        sys.exit(f"bench: {SIMULATED} is missing")
    result = trio.run(main, parser.parse_args())
    print(json.dumps(result))
