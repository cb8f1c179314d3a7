"""``provisionerd cost`` over the whole history, with real processes (issue 20 item 6, issue 18 item 1): the reference
controller (``refcontroller serve``), ``provisionerd run`` with the simulated provider's plugin, and the CLI.

Machines that never join are returned at their join deadline (2 s) and replaced while the demand stands, so
lifecycles end early in the run; their facts leave the resync set and the daemon's view (``--live`` sees none of
them at the end), yet ``provisionerd cost --json`` prices every one of them from the controller's log through the
history query, and its total is what the facts say: each machine's quote times its hours from launch to return.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir, simulated_provider

from provisionerd.daemon.admin_socket import request
from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    InstanceFact,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
)
from provisionerd.wire.messages import HistoryQuery

pytestmark = pytest.mark.process


def run_cli(config: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = procs.run(procs.provisionerd(command, "--config", config, "--json", *args))
    assert done.returncode == 0, done.stderr
    return done


def cli(config: Path, *args: str) -> dict:
    return json.loads(run_cli(config, "cost", *args).stdout)


def test_cost_prices_every_lifecycle_the_log_holds_including_those_pruned_from_the_view(tmp_path: Path) -> None:
    from refcontroller.api import open_refcontroller_process

    certs, config = make_certs(tmp_path, "clu"), tmp_path / "pd.toml"
    sim = simulated_provider(
        tmp_path,
        sim={"delays": {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}},
        join_deadline=2,
        idle_time=1,
        step_limit=50,
    )
    seen: dict = {}

    async def main(state: Path) -> None:
        async with (
            open_refcontroller_process(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0) as ctl,
            procs.open_procs() as started,
        ):

            async def log() -> list[CommittedFact]:
                """Every fact, read as an admin through the history query (the test's own reading of the log)."""
                facts: list[CommittedFact] = []
                after = until = 0
                while True:
                    page = await ctl.admin.history(HistoryQuery((), after, until))
                    facts += page.facts
                    if page.done:
                        return facts
                    after, until = page.next_after, page.until_index

            def ended(facts: list[CommittedFact]) -> set[str]:
                return {m for c in facts if isinstance(c.fact, Returned) for m in c.fact.machine_ids}

            def made(facts: list[CommittedFact]) -> list[InstanceFact]:
                return [c.fact for c in facts if isinstance(c.fact, InstanceFact)]

            async def ended_at_least(count: int) -> bool:
                return len(ended(await log())) >= count

            async def all_ended() -> list[CommittedFact] | None:
                """Every machine made has ended, and every op has ended too (a request fulfilled or failed, a return
                confirmed): with demand 0, nothing more is committed. Found under CPU load: a request still open
                when the machines ended committed its last facts between this test's read of the log and the
                daemon's cost report (until_index 18, the log read at 16)."""
                facts = await log()
                if not facts or {f.machine_id for f in made(facts)} - ended(facts):
                    return None
                requests = {c.fact.op_id: c.fact.count for c in facts if isinstance(c.fact, RequestIntent)}
                failed = {c.fact.op_id for c in facts if isinstance(c.fact, RequestFailed)}
                returns = {c.fact.op_id for c in facts if isinstance(c.fact, ReturnIntent)}
                confirmed = {c.fact.op_id for c in facts if isinstance(c.fact, Returned)}
                made_by = Counter(f.op_id for f in made(facts))
                open_requests = [op for op, n in requests.items() if op not in failed and made_by[op] < n]
                return None if open_requests or returns - confirmed else facts

            def view_empty() -> bool:
                try:
                    reply = request(daemon.sock, {"cmd": "cost", "scope": "live"})
                except (OSError, ValueError):
                    return False
                return bool(reply.get("ok")) and reply["cost"]["lines"] == []

            daemon = Daemon.write(
                daemon_config(certs, ctl.addresses, state, sim, cluster="clu", identity="prov-cost"), config, started
            )
            process = await daemon.start()
            await daemon.wait_held(60)
            await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
            # Never joined: returned at the deadline and replaced, twice over.
            await wait.until("4 lifecycles ended (Returned)", lambda: ended_at_least(4), 150, interval=0.3)
            seen["live_midway"] = await trio.to_thread.run_sync(cli, config, "--live")
            seen["history_midway"] = await trio.to_thread.run_sync(cli, config)
            await ctl.set_demand([])
            await wait.until("every machine made also ended", all_ended, 150, interval=0.3)
            await wait.until(
                "the daemon folded the last returns and pruned its view (cost --live: no lines)",
                lambda: trio.to_thread.run_sync(view_empty),
                30,
            )
            seen["facts"] = await log()
            seen["history"] = await trio.to_thread.run_sync(cli, config)
            seen["history_again"] = await trio.to_thread.run_sync(cli, config)
            seen["live"] = await trio.to_thread.run_sync(cli, config, "--live")
            seen["history_all"] = await trio.to_thread.run_sync(run_cli, config, "history", "--all")
            seen["history_page"] = await trio.to_thread.run_sync(run_cli, config, "history", "--limit", "4")
            seen["controller"] = await ctl.status()
            seen["rc"] = await process.stop(20)
            seen["log"] = process.tail(60)

    started_at = time.time()
    with short_dir("pd-cost-") as state:
        trio.run(main, state)
    ended_at = time.time()
    assert seen["rc"] == 0, seen["log"]
    facts: list[CommittedFact] = seen["facts"]
    instances = [c.fact for c in facts if isinstance(c.fact, InstanceFact)]
    returned_at = {m: c.fact.at for c in facts if isinstance(c.fact, Returned) for m in c.fact.machine_ids}
    assert len(instances) >= 4 and set(returned_at) >= {f.machine_id for f in instances}
    assert all(f.price.known and f.price.unit == "hour" and f.price.currency == "USD" for f in instances)
    expected = sum(f.price.amount * (returned_at[f.machine_id] - f.launch_time) / 3600 for f in instances)
    history = seen["history"]
    assert history["scope"] == "history" and history["history"]["until_index"] == facts[-1].index
    assert history["totals"]["USD"] == pytest.approx(expected, rel=1e-6, abs=1e-6) and expected > 0
    assert sum(line["machines"] for line in history["lines"]) == len(instances)
    assert history["not_estimated"] == {"unpriced": 0, "other_unit": 0, "no_time": 0}
    # The daemon keeps its fold: each report reads only the facts committed since the last one.
    midway = seen["history_midway"]["history"]
    assert 0 < midway["facts"] < history["history"]["facts"] == len(facts)
    assert history["history"]["read_now"] == len(facts) - midway["facts"]
    again = seen["history_again"]
    assert again["history"]["read_now"] == 0 and again["history"]["facts"] == len(facts)
    assert again["totals"] == history["totals"] and again["lines"] == history["lines"]
    # The daemon's view was pruned to live state: at the end it holds none of those machines, and midway it held
    # only the live ones, fewer than the history had by then.
    assert seen["live"]["scope"] == "live" and seen["live"]["lines"] == [] and seen["live"]["totals"] == {}
    machines = {key: sum(line["machines"] for line in seen[key]["lines"]) for key in ("live_midway", "history_midway")}
    assert machines["live_midway"] < machines["history_midway"], machines
    assert seen["controller"]["stats"].get("history_refused", 0) == 0
    # provisionerd history: the same log, every fact of the daemon's provider, ended ones included; one page of 4
    # says where the next starts.
    listed = [json.loads(line) for line in seen["history_all"].stdout.splitlines()]
    assert [(f["index"], f["kind"]) for f in listed] == [(c.index, type(c.fact).__name__) for c in facts]
    # Each with when the controller committed it (its wall clock), as the admin's history query reads it too.
    assert [f["committed_at"] for f in listed] == [c.committed_at for c in facts]
    assert all(started_at <= c.committed_at <= ended_at for c in facts), (started_at, ended_at)
    first = [json.loads(line)["index"] for line in seen["history_page"].stdout.splitlines()]
    assert first == [c.index for c in facts[:4]]
    assert f"more facts follow: --after {facts[3].index} --until {facts[-1].index}" in seen["history_page"].stderr
