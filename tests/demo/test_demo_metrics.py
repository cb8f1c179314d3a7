"""During the real demo (processes, sockets, the real clock) the test scrapes the daemon's ``/metrics`` and checks the
machine and lease series against the demo's own counts at two moments: every worker joined (after the failover),
and none left after the drain (the daemon's view follows the controller's host pushes: the scrape is repeated, for
at most 10 s, until it agrees). ``/readyz`` answers ready once the demo saw the lease held."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio
from demo_scan import processes_naming
from prometheus_client.parser import text_string_to_metric_families

from provisionerd.demo import cluster as dc
from provisionerd.demo import script as demo_script
from provisionerd.demo.progress import Progress
from provisionerd.demo.run import run_demo

pytestmark = pytest.mark.process

WORKERS = 8


async def get(address: str, path: str) -> tuple[int, str]:
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


def series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_the_demo_s_metrics_agree_with_its_own_counts_when_joined_and_after_the_drain(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    moments: dict[str, dict] = {}
    originals = {name: getattr(demo_script.DemoRun, name) for name in ("_daemon", "_rejoin", "_drain")}

    async def scrape(run: demo_script.DemoRun, moment: str) -> None:
        """Scrape until the daemon's machines agree with the controller's live hosts the demo just saw (the daemon's
        view follows the controller's host pushes, a moment behind its admin status), for at most 10 s."""
        assert run.config is not None and run.config.daemon.metrics_listen is not None
        address = run.config.daemon.metrics_listen
        seen = run.observer.snapshot
        with trio.move_on_after(10):
            while True:
                status, text = await get(address, "/metrics")
                states = series(text, "provisionerd_machines")
                live = sum(v for labels, v in states.items() if dict(labels)["state"] in ("joined", "idle", "busy"))
                if moment == "_daemon" or live == seen.live_hosts:
                    break
                await trio.sleep(0.2)
        ready, _ = await get(address, "/readyz")
        health, _ = await get(address, "/healthz")
        moments[moment] = {"status": status, "text": text, "ready": ready, "live": health, "seen": seen}

    def wrapped(name: str):
        async def step(self: demo_script.DemoRun) -> None:
            await originals[name](self)
            await scrape(self, name)

        return step

    for name in originals:
        monkeypatch.setattr(demo_script.DemoRun, name, wrapped(name))

    async def main():
        with trio.fail_after(150):
            return await run_demo(WORKERS, Progress(io.StringIO(), tty=False, workers=WORKERS), trio.CancelScope())

    summary = trio.run(main)
    assert summary.ok, summary.error
    assert set(moments) == {"_daemon", "_rejoin", "_drain"}
    assert all(m["status"] == 200 and m["live"] == 200 for m in moments.values())
    assert moments["_daemon"]["ready"] == 200  # the demo saw the link up and the lease held: ready
    provider = (("provider", dc.PROVIDER),)

    def machines(moment: str) -> dict[str, float]:
        found = series(moments[moment]["text"], "provisionerd_machines")
        return {dict(labels)["state"]: v for labels, v in found.items() if dict(labels)["provider"] == dc.PROVIDER}

    for moment in ("_rejoin", "_drain"):
        text, seen = moments[moment]["text"], moments[moment]["seen"]
        held = series(text, "provisionerd_lease_state")[(*provider, ("state", "held"))]
        term = series(text, "provisionerd_lease_epoch_term")[provider]
        seq = series(text, "provisionerd_lease_epoch_seq")[provider]
        assert held == 1.0 and seen.lease == "held"
        assert f"{int(term)}.{int(seq)}" == seen.epoch  # the epoch the daemon's status shows the demo
        assert moments[moment]["ready"] == 200
    joined, drained = machines("_rejoin"), machines("_drain")
    # Every worker joined and idle: the controller's count, the demo's own, and the metric agree.
    seen = moments["_rejoin"]["seen"]
    assert seen.live_hosts == seen.idle == WORKERS
    assert joined["joined"] + joined["idle"] + joined["busy"] == seen.live_hosts == WORKERS
    assert joined["idle"] == seen.idle
    assert joined["requested"] == joined["booting"] == joined["returning"] == 0
    wanted = series(moments["_rejoin"]["text"], "provisionerd_demand_wanted_machines")
    supplied = series(moments["_rejoin"]["text"], "provisionerd_demand_supplied_machines")
    assert wanted[(*provider, ("template", dc.TEMPLATE))] == supplied[(*provider, ("template", dc.TEMPLATE))] == WORKERS
    # After the drain: nothing of any state is left, as the demo sees it.
    assert moments["_drain"]["seen"].live_hosts == 0
    assert drained == dict.fromkeys(drained, 0.0) and set(drained) >= {"joined", "idle", "busy", "returning"}
    calls = series(moments["_drain"]["text"], "provisionerd_provider_calls_total")
    requests = sum(v for labels, v in calls.items() if dict(labels)["action"] == "requestMachines")
    assert requests >= 1
    committed = series(moments["_drain"]["text"], "provisionerd_intents_committed_total")
    assert sum(committed.values()) >= 2  # at least the request and the return intents
    reconnects = series(moments["_drain"]["text"], "provisionerd_link_reconnects_total")
    assert reconnects[()] >= 1  # the failover made the daemon rejoin
    assert processes_naming(str(tmp_path)) == []
