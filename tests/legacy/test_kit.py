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

pytestmark = pytest.mark.process
EXAMPLE = Path(__file__).resolve().parents[2] / "providers" / "examples" / "lsf_legacy"


@pytest.fixture(autouse=True)
def real_python_first(monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def run(capsys, *argv, timeout: str = "10") -> tuple[int, dict[str, tuple[bool, str]]]:
    code = main(["check", "--json", "--timeout", timeout, *argv])
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
        "not offered: all-or-nothing requests",
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
    # A short settle time: the sticky return's machines never leave, so the kit waits it out (60 s by default).
    conf = conf_with(tmp_path, settings)
    code, rows = run(capsys, "--settle", "3", "--conf-dir", str(conf), str(EXAMPLE), timeout="5")
    ok, detail = rows[row]
    assert code == 1 and not ok and reason in detail, detail
    if "STICKY_RETURN" in settings:  # the kit tried to return them for the settle time given, then said so
        ok, detail = rows["every machine the kit asked for is returned"]
        assert not ok and detail.startswith("could not return 2: "), detail


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_settle_time_that_is_not_a_positive_number_exits_2(capsys, value):
    assert main(["check", "--settle", value, str(EXAMPLE)]) == 2
    assert "--settle must be a positive number of seconds" in capsys.readouterr().err


def test_an_accepted_unknown_template_is_a_warning_and_its_machine_is_returned(tmp_path, capsys):
    conf = conf_with(tmp_path, {"ACCEPT_ANY_TEMPLATE": True})
    data = tmp_path / "data"
    code = main(["check", "--json", "--timeout", "10", "--conf-dir", str(conf), "--data-dir", str(data), str(EXAMPLE)])
    report = json.loads(capsys.readouterr().out)
    rows = {c["name"]: c for c in report["checks"]}
    assert code == 0, report
    unknown = rows["an unknown template is refused"]
    assert unknown["ok"] and unknown["warning"] and "accepted" in unknown["detail"]
    assert report["warnings"] == 1
    returned = rows["every machine the kit asked for is returned"]
    assert returned["ok"], returned
    machines = json.loads((data / "lsfexample-state.json").read_text())["machines"]
    assert len(machines) == 3 and all(m["status"] == "terminated" for m in machines.values())  # 2 + the unknown one


def test_a_conf_dir_without_the_templates_says_where_it_looked(tmp_path, capsys):
    empty = tmp_path / "aws" / "conf"
    empty.mkdir(parents=True)
    (empty / "awsprov_templates.json").write_text('{"templates": []}')  # one level too deep for an awsv2 layout
    code, rows = run(capsys, "--conf-dir", str(empty), str(EXAMPLE))
    ok, detail = rows["getAvailableTemplates is valid"]
    assert code == 1 and not ok
    assert f"{empty}/*templates.json: found awsprov_templates.json" in detail
    assert f"{empty}/conf/*templates.json: missing" in detail
    assert f"try --conf-dir {tmp_path / 'aws'}" in detail


def test_env_values_reach_the_plugin_and_never_the_report(tmp_path, capsys):
    conf = conf_with(tmp_path, {"LOG_INPUTS": True})
    data = tmp_path / "data"
    env_file = tmp_path / "plugin.env"
    # A value that would be in the report (the template's id): it must come out redacted.
    env_file.write_text("# the plugin's settings\nexport LSFEX_SECRET=lsfex-small\n")
    code = main(
        [
            "check", "--json", "--timeout", "10", "--conf-dir", str(conf), "--data-dir", str(data),
            "--env-file", str(env_file), "--env", f"PROVIDER_NAME={EXAMPLE.name}-given", str(EXAMPLE),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "lsfex-small" not in out and "'***'" in out  # a value given to the kit is a secret: redacted
    # The example logs under its PROVIDER_NAME: the given value reached it.
    assert f"{EXAMPLE.name}-given" in (data / "lsfexample-provider.log").read_text()


def test_bad_env_arguments_exit_2_without_echoing_the_value(tmp_path, capsys):
    assert main(["check", "--env", "no-equals-s3cr3t", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err
    assert "--env #1" in err and "s3cr3t" not in err
