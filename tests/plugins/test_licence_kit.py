"""The conformance kit's licence-pool row (``provisionerd provider check``) against the simulated provider: it
passes for a plugin that declares pools, says "never asked" for one that does not, and fails, typed, for one that
answers garbage."""

from __future__ import annotations

import json

import pytest
from plugintest_client import REPO, SIMULATED
from rigs import procs

from provisionerd.provider.kit import LICENSE_ROW

pytestmark = pytest.mark.process
POOLS = [{"pool": "matlab", "granted": 3, "inUse": 1}, {"pool": "ansys", "granted": 2, "inUse": 2}]


def kit(tmp_path, name: str, **extra) -> dict:
    conf = tmp_path / name
    conf.mkdir()
    shipped = json.loads((SIMULATED / "conf" / "simulated.json").read_text())
    (conf / "simulated.json").write_text(json.dumps({**shipped, **extra}))
    argv = ["provider", "check", "--json", "--transport", "persistent", "--timeout", "20", "--conf-dir", str(conf)]
    run = procs.run(procs.provisionerd(*argv, SIMULATED), cwd=REPO, timeout=120)
    summary = json.loads(run.stdout)
    return {c["name"]: (c["ok"], c["detail"]) for c in summary["checks"]}


def test_the_licence_row_checks_declared_pools_and_skips_undeclared_ones(tmp_path):
    declared = kit(tmp_path, "pools", licensePools=POOLS)
    assert declared[LICENSE_ROW] == (True, "2 pools in 2 pages, 2 units granted and idle; unknown pool refused")
    assert all(ok for ok, _ in declared.values()), declared
    undeclared = kit(tmp_path, "none")
    assert undeclared[LICENSE_ROW] == (True, "not declared (features.licensePools is false): never asked")


def test_a_plugin_answering_garbage_fails_the_row_with_a_typed_error(tmp_path):
    rows = kit(tmp_path, "garbage", licensePools=POOLS, faults=[{"kind": "garbage", "actions": ["listLicenses"]}])
    ok, detail = rows[LICENSE_ROW]
    assert not ok and detail.startswith("ProviderProtocolViolation"), detail
