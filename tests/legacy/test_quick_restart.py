"""A daemon killed during a legacy ``requestMachines`` and restarted at once (issue 31, finding 2).

The plugin call runs on in its own session and answers while the new process is already up: after the new adapter
started (so its start-up collection missed it) and before the recovery asked what became of the op. Asked then, the
adapter must collect the answer (an accepted call, polled as usual), never report the op as an unknown outcome:
the daemon fails an unknown op and plans again, and the machines the answer named would have no fact.

A real "daemon" process (the adapter in a child interpreter) is killed with SIGKILL once the plugin has made its
machines; the plugin is the LSF example, unmodified, on the real clock.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import procs, wait

from provisionerd.domain.model import NO_EPOCH, InstanceFact, RequestFailed, RequestIntent
from provisionerd.provider.client import PluginClient
from provisionerd.provider.legacy.adapter import REQUEST_PREFIX
from provisionerd.provider.legacy.journal import ACCEPTED
from tests.legacy.test_under_the_executor import facts, with_executor

pytestmark = pytest.mark.process

DAEMON = """
import json, sys, trio
sys.path[:0] = [sys.argv[1], str(__import__("pathlib").Path(sys.argv[1]).parent)]
from conftest import World
from pathlib import Path
world = World.__new__(World)
world.conf, world.data, world.journal = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
world.tokens = {}
adapter = world.adapter(calls_dir=sys.argv[5])
trio.run(lambda: adapter.call("requestMachines", world.request("op-1", 2)))
"""


async def killed_after_it_made_its_machines(started: procs.Procs, world: Any, calls: Path, tmp_path: Path) -> None:
    """The "daemon" started, SIGKILLed once the plugin made both machines (its call runs on in its own session)."""
    here = Path(__file__).parent
    argv = [sys.executable, "-c", DAEMON, here, world.conf, world.data, world.journal, calls]
    first = await started.start("daemon", argv, tmp_path / "daemon.log")
    await wait.until_sync("the plugin made both machines", lambda: len(world.plugin_machines()) == 2, 60)
    first.kill9()
    await first.wait()


def calls_left(calls: Path) -> list[Path]:
    return [p for p in calls.iterdir() if not p.name.startswith(".")] if calls.is_dir() else []


def test_an_answer_landing_after_the_restart_is_collected_not_taken_for_an_unknown_outcome(world: Any, h, tmp_path):
    calls = tmp_path / "calls"
    world.settings({"BOOT_POLLS": 1, "SLOW_REQUEST_SECONDS": 2.0, "SLOW_REQUEST_PHASE": "after_create"})

    async def main() -> tuple[list[Any], dict[str, Any], list[str]]:
        async with procs.open_procs() as started:
            await killed_after_it_made_its_machines(started, world, calls, tmp_path)
            # Restarted at once: the plugin is still in its sleep, its answer not written yet.
            restarted = world.adapter(calls_dir=str(calls))
            assert restarted.runner.pending_ops() == {"op-1"}
            await wait.until_sync(
                "the plugin's answer in its call directory",
                lambda: any((p / "status").exists() for p in calls_left(calls)),
                30,
            )
            unknown = restarted.unknown_outcomes()
            journal = json.loads(world.journal.read_text())
            entry = await h.settle(restarted, REQUEST_PREFIX + "op-1")  # polled as usual
            return unknown, entry, [c["state"] for c in journal["creates"][0]["calls"]]

    unknown, entry, states = trio.run(main)
    assert unknown == []
    assert states == [ACCEPTED]
    assert sorted(m["machineId"] for m in entry["machines"]) == sorted(world.plugin_machines())
    assert calls_left(calls) == []


def test_the_recovery_waits_for_a_call_still_running_then_settles_it_from_its_answer(world: Any, tmp_path):
    """Issue 31 item 2: after the restart the recovery's decision is ``recovery_rules.recover_request``. While the
    call the killed process left still runs, the op is waited for (``call_running``): nothing listed, nothing
    failed. Once the call has answered, the recovery settles the op from that answer: both machines get their
    instance facts and nothing is failed or asked again."""
    calls = tmp_path / "calls"
    world.settings({"BOOT_POLLS": 1, "SLOW_REQUEST_SECONDS": 4.0, "SLOW_REQUEST_PHASE": "after_create"})
    refs = ("op-1/i-0", "op-1/i-1")
    intent = RequestIntent("lsfex", NO_EPOCH, "op-1", "lsfex-small", 2, refs, ("0" * 64, "1" * 64), "d1")

    async def recover(executor: Any) -> Any:
        return await executor.recover_request(intent)

    async def kill_mid_call() -> None:
        async with procs.open_procs() as started:
            await killed_after_it_made_its_machines(started, world, calls, tmp_path)

    trio.run(kill_mid_call)
    restarted = world.adapter(calls_dir=str(calls))
    assert PluginClient(restarted).calls_running() == frozenset({"op-1"})
    waited, controller = trio.run(with_executor, restarted, recover)
    assert (waited.status, waited.code) == ("unknown", "call_running")
    assert facts(controller, RequestFailed) == [] and world.inputs("getRequestStatus") == []
    wait.blocking("the plugin's answer", lambda: any((p / "status").exists() for p in calls_left(calls)), 30)
    settled, controller = trio.run(with_executor, restarted, recover)
    assert settled.status == "fulfilled" and sorted(settled.machine_ids) == sorted(world.plugin_machines())
    assert sorted(f.instance_ref for f in facts(controller, InstanceFact)) == sorted(refs)
    assert facts(controller, RequestFailed) == [] and len(world.inputs("requestMachines")) == 1
    assert PluginClient(restarted).calls_running() == frozenset()
