"""A controller whose disk is full (SQLite really answering ``database or disk is full``: ``PRAGMA max_page_count``
through the test-only limit file), then freed. Real clock: the reference controller on real TLS sockets in this
process, the daemon core, the simulated provider as a real persistent plugin.

Done when (issue 15, item 4): the daemon logs ``storageFailure`` at WARNING, keeps its link, makes no provider
call for an intent the controller refused, and meets the demand within one replan interval (10 s, the default)
after the disk is freed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio
from rigs import wait
from rigs.core import daemon_core, record, running
from rigs.daemon import make_certs, short_dir
from rigs.facts import facts_of
from sim_daemon import CLUSTER, sim_config

from provisionerd.controller.session_settings import LinkState
from provisionerd.domain.model import DemandItem, Epoch, InstanceFact, ResourceShape
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from refcontroller.store import PAGE_LIMIT_ENV, FactStore, StoreFailure
from tests.refcontroller.rc_factories import intent

pytestmark = pytest.mark.process

REPLAN = 10.0  # the default replan interval: "one reconcile interval"


def fill(store: FactStore) -> None:
    """Fill the fact log's last pages with the smallest facts of another provider (the daemon does not serve it)
    until ten in a row are refused: after that, no intent of the daemon's fits either."""
    refused = 0
    for n in range(100000):
        try:
            store.append(intent("s", Epoch(1, 1), op_id=f"f{n}", refs=(f"r{n}",)), "filler")
        except StoreFailure:
            refused += 1
            if refused == 10:
                return
        else:
            refused = 0
    raise AssertionError("the page limit never bit")


def test_a_full_disk_at_the_controller_is_typed_costs_no_provider_call_and_demand_follows_the_freeing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from refcontroller.listeners import ServeConfig, serve

    limit = tmp_path / "page-limit"
    monkeypatch.setenv(PAGE_LIMIT_ENV, str(limit))
    caplog.set_level(logging.WARNING, logger="provisionerd.controller.session")
    certs = make_certs(tmp_path, CLUSTER)
    address = f"127.0.0.1:{wait.free_port()}"
    measured: dict[str, float] = {}

    async def main(state: Path) -> None:
        config = sim_config(tmp_path, certs, (address,), state, identity="prov-storage")
        recorded = record(config, "sim")
        core = daemon_core(
            config,
            policy=Policy(cluster=CLUSTER, idle_time=600.0, join_deadline=600.0, provisioning_timeout=60.0),
            loop=LoopSettings(replan_interval=REPLAN, reclaim_interval=30.0, recover_after=30.0),
            recorded=recorded,
        )
        serve_config = ServeConfig(
            certs_dir=certs, data_dir=tmp_path / "ctl", listen=(address,), lease_ttl=5.0, check_interval=0.3
        )
        async with trio.open_nursery() as controller:
            cluster = (await controller.start(serve, serve_config)).server.cluster
            async with running(core, recorded.inner, release=0.5):
                await wait.until_sync(
                    "the link up and every lease held",
                    lambda: core.session.state is LinkState.UP and all(k.valid() for k in core.keepers.values()),
                )
                generation = core.session.generation
                # One synchronous step: the demand is stored, then the disk is full before the daemon hears of it.
                cluster.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 4)])
                limit.write_text("1")
                fill(cluster.store)
                await wait.until_sync("3 storage failures", lambda: core.session.storage.count >= 3, 30.0)
                assert core.session.state is LinkState.UP and core.session.generation == generation  # the link kept
                limit.unlink()  # the disk is freed
                freed = trio.current_time()
                await wait.until_sync(
                    "4 instance facts after the freeing",
                    lambda: len(facts_of(cluster.store, InstanceFact)) == 4,
                    3 * REPLAN,
                )
                measured["after_free"] = trio.current_time() - freed
                measured["failures"] = core.session.storage.count
                assert core.session.status()["storage_failures"] == core.session.storage.count
                refused = {
                    e["op_id"]
                    for e in core.events.recent
                    if e["event"] == "controller_storage_failure" and e["request"] == "FactCommit"
                }
                intents = {c.fact.op_id for c in cluster.store.all_facts() if c.fact.op_id in refused}
                requests = [json.dumps(i, sort_keys=True) for i in recorded.inputs("requestMachines")]
                measured["refused_intents"] = len(refused - intents)
                assert refused - intents, "no intent was refused"
                for op_id in refused - intents:  # never in the log: no provider call carries its op_id
                    assert not any(op_id in payload for payload in requests), op_id
            controller.cancel_scope.cancel()

    with short_dir("pd-sto-") as state:
        trio.run(main, state)
    warnings = [r for r in caplog.records if "storageFailure" in r.getMessage()]
    assert warnings and all(r.levelno == logging.WARNING for r in warnings)
    print(f"measured: {measured}")
    assert measured["after_free"] < REPLAN, measured
