"""The reclaim poll by tags with real processes (issue 36: ``features.reclaimsByTags``): ``provisionerd run`` on
the simulated provider (one-shot) against an in-process reference controller, on the real clock. The plugin
declares the feature; its ``reclaim`` fault takes one live machine back. The daemon asks ``getReturnRequests`` by
the cluster's tag only, naming no machine, and still records that machine as lost to the provider (``Lost``,
reason ``reclaimed``: the provider ends it, no return call), and no other, and makes a replacement. Each
``getReturnRequests`` input the plugin got is kept by a wrapper around the shipped script."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from rigs import wait
from rigs.daemon import SIMULATED
from rigs.simulated_run import simulated_run

from provisionerd.domain.model import DemandItem, InstanceFact, Lost, ResourceShape, ReturnIntent

pytestmark = pytest.mark.process


def wrapped_scripts(root: Path, log: Path) -> Path:
    """The simulated provider's one-shot scripts, each running the shipped one; ``getReturnRequests.sh`` first
    appends its input (``-f FILE``) to ``log``, one line a call."""
    root.mkdir()
    for script in SIMULATED.glob("*.sh"):
        keep = f'tr -d "\\n" < "$2" >> {log}; echo >> {log}\n' if script.name == "getReturnRequests.sh" else ""
        wrapper = root / script.name
        wrapper.write_text(f'#!/bin/sh\n{keep}exec "{script}" "$@"\n')
        os.chmod(wrapper, 0o755)
    return root


def test_a_machine_the_provider_takes_back_is_returned_though_no_machine_is_named(tmp_path):
    log = tmp_path / "reclaim-inputs.jsonl"
    plugin = wrapped_scripts(tmp_path / "scripts", log)
    faults = [{"kind": "reclaim", "count": 1, "gracePeriod": 60, "times": 1, "after": 1}]
    seen: dict = {}

    async def main():
        async with simulated_run(tmp_path, "rbt", identity="prov-rbt", faults=faults, plugin=plugin) as run:
            daemon = await run.daemon.start()
            await run.daemon.wait_held(60)
            await run.ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
            await wait.until_sync("3 instance facts", lambda: len(run.facts(InstanceFact)) >= 3, 60)

            # The first poll (30 s after the start) is the fault's "after"; the second takes a machine back.
            await wait.until_sync("a machine lost to the reclaim", lambda: run.facts(Lost), 120)
            await wait.until_sync("its replacement", lambda: len(run.facts(InstanceFact)) >= 4, 60)
            seen["lost"] = run.facts(Lost)
            seen["returns"] = run.facts(ReturnIntent)
            seen["machines"] = run.machines()
            seen["rc"] = await daemon.stop(20)
            seen["log"] = daemon.tail()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"]
    taken = {m["machineId"] for m in seen["machines"].values() if "reclaimedAt" in m}
    assert len(taken) == 1, seen["machines"]
    assert [(f.machine_id, f.reason) for f in seen["lost"]] == [(next(iter(taken)), "reclaimed")]
    assert seen["returns"] == []
    asked = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(asked) >= 2
    assert all(doc["machines"] == [] and doc["tags"] == {"provisionerd:cluster": "clu"} for doc in asked), asked
