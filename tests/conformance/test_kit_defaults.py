"""``provisionerd controller check --admin`` against ``refcontroller serve`` started exactly as an implementer would
(three loopback addresses and nothing else, so a 30 s lease TTL, a 35 s grace after the start and a 15 s heartbeat
timeout), and at the suite's short TTL: no row fails.

At the defaults the grace outlasts the heartbeat timeout, so the kit must keep its connection alive while it waits
the grace out (issue 33: it did not, and the controller dropped it as silent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rigs import procs
from rigs.controller import serving

from provisionerd.conformance.battery import CHECKS

pytestmark = pytest.mark.process

#: The grace at the defaults (35 s) twice over (after the start and after the failover), plus the rows.
LIMIT = 240.0


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param((), id="serve-defaults", marks=pytest.mark.long),  # the 35 s grace waited out twice
        pytest.param(("--lease-ttl", "3", "--check-interval", "0.5"), id="ttl-3"),
    ],
)
def test_the_kit_passes_the_reference_controller(certs: Path, tmp_path: Path, flags: tuple[str, ...]) -> None:
    listen = ",".join(["127.0.0.1:0"] * 3)
    with serving(certs, tmp_path / "data", tmp_path / "controller.log", *flags, listen=listen) as served:
        addresses = served.ready["listen"]
        argv = procs.provisionerd("controller", "check", "--admin", "--json", "--connect", ",".join(addresses))
        done = procs.run([*argv, "--certs", str(certs)], timeout=LIMIT)
    report = json.loads(done.stdout) if done.stdout.startswith("{") else {}
    failed = [f"{row['name']}: {row['evidence']}" for row in report.get("rows", []) if row["status"] != "PASS"]
    assert done.returncode == 0 and not failed, "\n".join(failed) or done.stdout + done.stderr
    assert report["counts"] == {"PASS": len(CHECKS), "FAIL": 0, "NOT RUN": 0}
    assert report["cleanup"].startswith(f"{report['cleanup'].split()[0]} of ")
