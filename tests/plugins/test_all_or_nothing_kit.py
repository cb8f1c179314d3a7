"""The conformance kit's all-or-nothing row (``provisionerd provider check``): it passes on the simulated provider,
which refuses a request its template cannot hold whole; says "never asked" for a plugin that does not declare
``allOrNothing``; and fails, naming what it made, on a plugin that declares it yet makes what fits (the kit's
clean-up then returns those machines)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from plugintest_client import REPO, SIMULATED
from rigs import procs

from provisionerd.provider.kit import ALL_OR_NOTHING_ROW, RETURN_ROW

pytestmark = pytest.mark.process
MINI = REPO / "tests" / "provider" / "plugins" / "mini.py"


def kit(plugin: Path, conf: Path | None = None) -> dict[str, tuple[bool, str]]:
    argv = ["provider", "check", "--json", "--transport", "persistent", "--timeout", "20"]
    argv += ["--conf-dir", str(conf)] if conf else []
    run = procs.run(procs.provisionerd(*argv, plugin), cwd=REPO, timeout=120)
    summary = json.loads(run.stdout)
    return {c["name"]: (c["ok"], c["detail"]) for c in summary["checks"]}


def mini(root: Path, breaks: list[str]) -> Path:
    """``tests/provider/plugins/mini.py`` as a persistent plugin, with ``breaks`` (its docstring lists them)."""
    (root / "conf").mkdir(parents=True)
    (root / "conf" / "mini.json").write_text(json.dumps({"break": breaks}))
    exe = root / "provider"
    exe.write_text(f'#!/bin/sh\nexec "$PROVISIONERD_PYTHON" -S {MINI} serve "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return root


def test_the_simulated_provider_refuses_what_its_template_cannot_hold_and_passes(tmp_path):
    rows = kit(SIMULATED)
    template = json.loads((SIMULATED / "conf" / "simulated.json").read_text())["templates"][0]
    count = template["maxNumber"] + 1
    assert rows[ALL_OR_NOTHING_ROW] == (
        True,
        f"{count} machines of {template['templateId']!r} (maxNumber + 1), all or nothing -> quota_exceeded;"
        " listMachines shows no machine of the op",
    )
    assert all(ok for ok, _ in rows.values()), rows


def test_a_plugin_that_makes_what_fits_fails_the_row_and_its_machines_are_returned(tmp_path):
    rows = kit(mini(tmp_path / "fits", ["aon_fits"]))
    ok, detail = rows[ALL_OR_NOTHING_ROW]
    assert not ok, detail
    assert detail.startswith("11 machines of 'small' (maxNumber + 1), all or nothing: the plugin accepted it")
    assert "and made 10 machines: m-" in detail
    ok, detail = rows[RETURN_ROW]
    # Two ops: the kit's first request (its own rows returned those machines) and this one, whose 10 the clean-up
    # returned.
    assert ok and detail.startswith("2 requests: returned ") and detail.count("m-") == 10, detail
    assert detail.endswith("; none left"), detail
    assert [name for name, (ok, _) in rows.items() if not ok] == [ALL_OR_NOTHING_ROW]

    undeclared = kit(mini(tmp_path / "plain", []))
    assert undeclared[ALL_OR_NOTHING_ROW] == (True, "never asked (allOrNothing not declared)")
