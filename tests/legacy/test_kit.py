"""`provisionerd provider check` on a legacy plugin: reported as legacy, LSF checks run, lacking guarantees listed,
exit 0 when the LSF checks pass; an LSF plugin that breaks the LSF contract still fails."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from provisionerd.cli.provider import main

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "providers" / "examples" / "lsf_legacy"


@pytest.fixture(autouse=True)
def real_python_first(monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def run(capsys, *argv) -> tuple[int, dict[str, tuple[bool, str]]]:
    code = main(["check", "--json", "--timeout", "10", *argv])
    report = json.loads(capsys.readouterr().out)
    return code, {c["name"]: (c["ok"], c["detail"]) for c in report["checks"]}


def conf_with(tmp_path: Path, settings: dict) -> Path:
    conf = tmp_path / "conf"
    conf.mkdir()
    shutil.copy(EXAMPLE / "conf" / "lsfexampleprov_templates.json", conf)
    (conf / "lsfexampleprov_config.json").write_text(json.dumps(settings))
    return conf


def test_the_lsf_example_passes_as_legacy(capsys):
    code, rows = run(capsys, str(EXAMPLE))
    assert code == 0, rows
    ok, detail = rows["legacy LSF plugin detected"]
    assert ok and "tagged_unknown" in detail
    for name in (
        "getAvailableTemplates is valid",
        "getRequestStatus reaches complete with every machine",
        "requestMachines gives a valid answer",
        "requestReturnMachines works and is confirmed",
        "getReturnRequests is valid",
        "an unknown template is refused",
        "join tokens never come back",
    ):
        assert rows[name][0], (name, rows[name])
    lacking = {n for n in rows if n.startswith("not offered: ")}
    assert lacking == {
        "not offered: idempotent requestMachines (op_id)",
        "not offered: listMachines",
        "not offered: owner tags",
        "not offered: per-machine bootstrap",
        "not offered: verified returns",
    }
    assert "describeProvider is valid and honest" not in rows  # not failed for lacking our extensions


@pytest.mark.parametrize(
    ("settings", "row", "reason"),
    [
        ({"SHORT_FILL": 1}, "getRequestStatus reaches complete with every machine", "partial fulfilment"),
        ({"STICKY_RETURN": True}, "requestReturnMachines works and is confirmed", "not succeeded"),
    ],
)
def test_an_lsf_plugin_that_breaks_the_lsf_contract_fails(tmp_path, capsys, settings, row, reason):
    code, rows = run(capsys, "--conf-dir", str(conf_with(tmp_path, settings)), str(EXAMPLE))
    ok, detail = rows[row]
    assert code == 1 and not ok and reason in detail, detail
