"""The conformance kit: a correct plugin passes, each kind of contract break fails with its reason."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from provisionerd.cli.provider import check_plugin, main, resolve_target
from provisionerd.provider.kit import IDEMPOTENT_ROW, KitOptions
from provisionerd.provider.schemas import ACTIONS

pytestmark = pytest.mark.process
REPO = Path(__file__).resolve().parents[2]


def mini_plugin(root: Path, h, breaks=(), actions=ACTIONS) -> Path:
    h.oneshot_dir(root, "mini.py", actions=[a for a in actions if a != "stopMachines"])
    h.persistent_exe(root, "mini.py")
    (root / "conf").mkdir()
    (root / "conf" / "mini.json").write_text(json.dumps({"break": list(breaks)}))
    return root


def run_cli(capsys, *argv) -> tuple[int, dict]:
    code = main(["check", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def rows(report: dict) -> dict[str, tuple[bool, str]]:
    return {c["name"]: (c["ok"], c["detail"]) for c in report["checks"]}


@pytest.mark.parametrize("transport", ["oneshot", "persistent"])
def test_a_correct_plugin_passes(tmp_path, capsys, h, transport):
    code, report = run_cli(capsys, "--transport", transport, str(mini_plugin(tmp_path / "p", h)))
    assert code == 0, report
    assert report["failed"] == 0 and report["passed"] == len(report["checks"]) >= 14


def test_the_kit_pages_the_listing(tmp_path, capsys, h):
    code, report = run_cli(capsys, "--transport", "persistent", str(mini_plugin(tmp_path / "p", h)))
    ok, detail = rows(report)["listMachines pages join up"]
    assert code == 0 and ok and detail == "2 machines in 2 pages of 1, each once", detail


@pytest.mark.parametrize(
    ("breaks", "ok", "detail"),
    [
        (["no_paging"], True, "does not page: 2 machines in one answer (fine up to the 8 MiB line cap)"),
        (["page_loop"], False, "cursor loop: page 2 returned cursor 'again' again"),
        (["page_repeat"], False, "machines on two pages: ['m-"),
    ],
)
def test_the_kit_says_how_a_plugin_pages(tmp_path, capsys, h, breaks, ok, detail):
    code, report = run_cli(capsys, "--transport", "persistent", str(mini_plugin(tmp_path / "p", h, breaks)))
    got_ok, got = rows(report)["listMachines pages join up"]
    assert (got_ok, code) == (ok, 0 if ok else 1) and got.startswith(detail), got


def test_table_output_and_exit_code(tmp_path, capsys, h):
    plugin = mini_plugin(tmp_path / "p", h, ["non_idempotent"])
    code = main(["check", "--transport", "persistent", "--timeout", "5", str(plugin)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"FAIL  {IDEMPOTENT_ROW}" in out and out.rstrip().endswith("1 failed")


@pytest.mark.parametrize(
    ("breaks", "row", "reason"),
    [
        (["bad_json"], "getAvailableTemplates is valid", "not JSON"),
        (["missing_fields"], "requestMachines gives a valid answer", "$.requestId: required: is missing"),
        (["non_idempotent"], IDEMPOTENT_ROW, "the repeat gave"),
        (["missing_tags"], "machines carry the owner tags and instanceRef", "owner tags missing or wrong"),
        (["untyped_errors"], "an invalid request gives a typed error", "the error is not an error body"),
    ],
)
def test_a_broken_plugin_fails_with_the_reason(tmp_path, capsys, h, breaks, row, reason):
    # The kit's logic does not depend on the transport; persistent keeps these fast.
    plugin = mini_plugin(tmp_path / "p", h, breaks)
    code, report = run_cli(capsys, "--transport", "persistent", "--timeout", "5", str(plugin))
    ok, detail = rows(report)[row]
    assert code == 1 and not ok
    assert reason in detail, detail


def test_missing_tags_also_fail_the_listing_check(tmp_path, capsys, h):
    _, report = run_cli(capsys, "--transport", "persistent", str(mini_plugin(tmp_path / "p", h, ["missing_tags"])))
    ok, detail = rows(report)["listMachines shows the owner tags"]
    assert not ok and "not listed under the owner tags (cluster 'conformance'): m-" in detail


def test_returned_machines_that_stay_listed_fail(tmp_path, h):
    plugin = mini_plugin(tmp_path / "p", h, ["sticky_return"])
    data = tmp_path / "data"
    data.mkdir()
    results = trio.run(
        lambda: check_plugin(
            plugin / "provider", "persistent", conf_dir=None, data_dir=data, options=KitOptions(timeout=5, settle=0.5)
        )
    )
    by_name = {r.name: r for r in results}
    assert not by_name["returned machines leave listMachines"].ok
    assert "still listed" in by_name["returned machines leave listMachines"].detail


@pytest.mark.parametrize("transport", ["oneshot", "persistent"])
def test_a_hang_is_reported_not_waited_for(tmp_path, capsys, h, transport):
    plugin = mini_plugin(tmp_path / "p", h, ["hang:getRequestStatus"])
    started = time.monotonic()
    code, report = run_cli(capsys, "--transport", transport, "--timeout", "1", str(plugin))
    elapsed = time.monotonic() - started
    ok, detail = rows(report)["getRequestStatus reaches complete"]
    assert code == 1 and not ok and detail.startswith("ProviderTimeout")
    assert rows(report)["an invalid request gives a typed error"][0]  # the kit went on after the hang
    assert elapsed < 20


def test_a_legacy_lsf_plugin_is_reported_as_legacy(tmp_path, capsys, h):
    # Without describeProvider/listMachines the kit runs the LSF checks in legacy mode (tests/legacy has the rest).
    # mini.py needs op_id, which legacy mode never sends, so its requests fail: a plugin that leans on our
    # extensions must declare them.
    legacy = [a for a in ACTIONS if a not in ("describeProvider", "listMachines")]
    code, report = run_cli(capsys, str(mini_plugin(tmp_path / "p", h, actions=legacy)))
    assert code == 1
    assert rows(report)["legacy LSF plugin detected"][0] is True
    assert rows(report)["getAvailableTemplates is valid"][0] is True
    assert rows(report)["requestMachines gives a valid answer"][0] is False


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nowhere")]) == 2
    assert main(["check", "--transport", "persistent", str(tmp_path)]) == 2
    assert main(["check", "--timeout", "0", str(tmp_path)]) == 2
    with pytest.raises(ValueError):
        resolve_target(tmp_path / "x", "oneshot")


@pytest.mark.parametrize("transport", ["oneshot", "persistent"])
def test_the_simulated_provider_passes(capsys, transport):
    simulated = REPO / "providers" / "simulated"
    if not (simulated / "provider").exists():
        pytest.skip("providers/simulated is not there yet")
    code, report = run_cli(capsys, "--transport", transport, str(simulated))
    assert code == 0, [c for c in report["checks"] if not c["ok"]]


def test_bad_json_fails_the_oneshot_kit_too(tmp_path, capsys, h):
    code, report = run_cli(capsys, str(mini_plugin(tmp_path / "p", h, ["bad_json"])))
    ok, detail = rows(report)["getAvailableTemplates is valid"]
    assert code == 1 and not ok and "stdout is not JSON" in detail
    assert rows(report)["requestMachines gives a valid answer"] == (
        False,
        "not run: getAvailableTemplates gave no usable template (see its row)",
    )


def test_a_plain_message_error_fails_the_oneshot_kit(tmp_path, capsys, h):
    _, report = run_cli(capsys, str(mini_plugin(tmp_path / "p", h, ["untyped_errors"])))
    ok, detail = rows(report)["an invalid request gives a typed error"]
    assert not ok and "got 'provider_error'" in detail
