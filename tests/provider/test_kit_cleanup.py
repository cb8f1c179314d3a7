"""The kit gives back every machine it asked for, whatever its request's status, and says so (issue 19 item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from provisionerd.cli.provider import check_plugin
from provisionerd.provider.kit import RETURN_ROW, KitOptions
from provisionerd.provider.schemas import ACTIONS

pytestmark = pytest.mark.process


def mini_plugin(root: Path, h, breaks=()) -> Path:
    h.oneshot_dir(root, "mini.py", actions=[a for a in ACTIONS if a != "stopMachines"])
    (root / "conf").mkdir()
    (root / "conf" / "mini.json").write_text(json.dumps({"break": list(breaks)}))
    return root


def machines_in(data: Path) -> dict:
    return json.loads((data / "mini-state.json").read_text())["machines"]


def run(plugin: Path, data: Path) -> dict:
    rows = trio.run(
        lambda: check_plugin(
            plugin, "oneshot", conf_dir=None, data_dir=data, options=KitOptions(timeout=5, settle=1.0, poll=0.1)
        )
    )
    return {r.name: r for r in rows}


def test_a_plugin_whose_status_never_completes_leaves_no_machine_behind(tmp_path, h):
    data = tmp_path / "data"
    data.mkdir()
    rows = run(mini_plugin(tmp_path / "p", h, ["never_complete"]), data)
    assert not rows["getRequestStatus reaches complete"].ok  # still running after the settle time
    returned = rows[RETURN_ROW]
    made = machines_in(data)
    assert returned.ok, returned
    assert returned.detail.endswith("none left")
    assert len(made) == 2 and all(m["status"] == "terminated" for m in made.values())
    # The status never gave the machines, the listing did: the return rows ran on those (issue 33).
    assert rows["requestReturnMachines works"].ok, rows["requestReturnMachines works"]


def test_machines_it_cannot_return_are_a_failed_row_naming_them(tmp_path, h):
    data = tmp_path / "data"
    data.mkdir()
    rows = run(mini_plugin(tmp_path / "p", h, ["never_complete", "sticky_return"]), data)
    made = sorted(machines_in(data))
    returned = rows[RETURN_ROW]
    assert not returned.ok
    assert f"could not return 2: {', '.join(made)}" in returned.detail
    assert f"the plugin's records are in {data}" in returned.detail


def test_a_correct_plugin_returns_everything_in_its_own_checks(tmp_path, h):
    data = tmp_path / "data"
    data.mkdir()
    rows = run(mini_plugin(tmp_path / "p", h), data)
    assert all(r.ok for r in rows.values()), [r for r in rows.values() if not r.ok]
    assert rows[RETURN_ROW].detail.endswith("none left")
    assert all(m["status"] == "terminated" for m in machines_in(data).values())
