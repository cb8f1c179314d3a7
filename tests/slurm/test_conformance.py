"""The conformance kit (``provisionerd provider check``) against the plugin and the real cluster, both transports."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs import plugin
from rigs.slurm import PLUGIN, SlurmTestCluster, plugin_config


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["persistent", "oneshot"])
def test_the_conformance_kit_passes(transport: str, clean_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    before = set(clean_cluster.jobs())
    done, summary = plugin.check(PLUGIN, tmp_path / "conf", plugin_config(clean_cluster), transport, timeout=180)
    failed = [c for c in summary["checks"] if not c["ok"]]
    assert done.returncode == 0 and not failed and summary["passed"] >= 14, (failed, done.stderr[-2000:])
    # The kit's two machines really were pilot jobs on the two nodes, and the kit's return cancelled them.
    kit_jobs = {j: info for j, info in clean_cluster.jobs().items() if j not in before}
    assert len(kit_jobs) == 2 and {info["state"] for info in kit_jobs.values()} == {"CANCELLED"}
    assert sorted(info["nodes"] for info in kit_jobs.values()) == ["n1", "n2"]
