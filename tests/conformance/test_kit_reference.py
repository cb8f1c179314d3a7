"""``provisionerd controller check`` against the reference controller as a real process (loopback), and against
deliberately broken variants of it (``refcontroller/rules.py``): the kit passes every row against the real one, and
fails each broken variant on the row that names its rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trio
from rigs import procs

from provisionerd.conformance import checks_state as state
from provisionerd.conformance.battery import CHECKS, Report, run_battery
from provisionerd.conformance.context import Context, KitOptions
from provisionerd.conformance.peer import Connector
from provisionerd.conformance.results import Status
from refcontroller.api import open_refcontroller_process
from refcontroller.rules import ENV, Rules

pytestmark = pytest.mark.process

#: Short leases, so the grace after the controller's start (ttl + check interval) is over in 3.5 s.
TTL, CHECK = 3.0, 0.5
ADMIN_ROWS = sum(c.admin for c in CHECKS)


async def _battery(certs: Path, data: Path, admin: bool) -> Report:
    async with open_refcontroller_process(certs, data, replicas=3, lease_ttl=TTL, check_interval=CHECK) as ctl:
        with trio.fail_after(120):
            return await run_battery(certs, ctl.addresses, KitOptions(admin=admin))


def _table(report: Report) -> str:
    return "\n".join(f"{r.status.value:<8} {r.name}: {r.evidence}" for r in report.rows)


def test_every_row_passes_against_the_reference_controller_with_admin(certs: Path, tmp_path: Path) -> None:
    report = trio.run(_battery, certs, tmp_path / "data", True)
    assert [r.name for r in report.rows] == [c.name for c in CHECKS]
    assert all(r.status is Status.PASS for r in report.rows), _table(report)
    assert report.cleanup.startswith(f"{report.cleanup.split()[0]} of {report.cleanup.split()[0]} intents ended")
    assert report.seconds < 60, report.seconds


@pytest.mark.parametrize("rule", Rules.names())
def test_each_broken_rule_fails_the_row_naming_it(
    rule: str, certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, rule)  # the controller process inherits it
    report = trio.run(_battery, certs, tmp_path / "data", True)
    failed = {r.rule for r in report.rows if r.status is Status.FAIL}
    assert rule in failed, _table(report)
    # Nothing else breaks, except that a standby accepting joins also serves the failover row's second process
    # (it asks a replica that is no longer the primary).
    collateral = {"grace_after_promotion"} if rule == "redirect_non_primary" else set()
    assert failed - {rule} <= collateral, _table(report)


def test_the_cli_without_admin_reports_the_failover_rows_not_run(certs: Path, tmp_path: Path) -> None:
    async def run() -> subprocess.CompletedProcess[str]:
        async with open_refcontroller_process(
            certs, tmp_path / "data", replicas=2, lease_ttl=TTL, check_interval=CHECK
        ) as ctl:
            argv = procs.provisionerd("controller", "check", "--json")
            argv += ["--connect", ",".join(ctl.addresses), "--certs", str(certs)]
            return await procs.run_async(argv, timeout=120)

    done = trio.run(run)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    not_run = [row for row in document["rows"] if row["status"] == "NOT RUN"]
    assert [row["name"] for row in not_run] == [c.name for c in CHECKS if c.admin]
    assert all("needs --admin" in row["evidence"] for row in not_run)
    assert document["ok"] is True
    assert document["counts"] == {"PASS": len(CHECKS) - ADMIN_ROWS, "FAIL": 0, "NOT RUN": ADMIN_ROWS}


def test_the_cli_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from provisionerd.cli.main import main

    assert main(["controller", "check", "--connect", "nohostport", "--certs", str(tmp_path)]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert main(["controller", "check", "--connect", "127.0.0.1:1", "--certs", str(tmp_path)]) == 2
    assert "no ca.pem" in capsys.readouterr().err


def test_rules_are_all_on_by_default_and_unknown_names_refused() -> None:
    assert all(getattr(Rules(), name) for name in Rules.names())
    assert Rules.from_env({}) == Rules()
    assert Rules.from_env({ENV: "page_bounds, role_allowlist"}) == Rules(page_bounds=False, role_allowlist=False)
    with pytest.raises(ValueError, match="no rule 'grace'"):
        Rules.without("grace")


def test_a_big_fact_then_499_small_ones_still_page_within_the_bounds(certs: Path, tmp_path: Path) -> None:
    async def run() -> str:
        async with open_refcontroller_process(
            certs, tmp_path / "data", replicas=1, lease_ttl=TTL, check_interval=CHECK
        ) as ctl:
            ctx = Context(Connector(certs), ctl.addresses, KitOptions())
            try:
                pages, sizes, *_ = await state.resync_with(ctx, ctx.provider("bigfirst"), True, small=499, big=1)
                return state.page_bound_evidence(pages, sizes)
            finally:
                await ctx.cleanup()

    trio.run(run)
