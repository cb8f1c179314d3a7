"""``provisionerd.resources`` (where the shipped files are) and ``provisionerd provider path``, in the checkout's
editable install. ``test_wheel.py`` checks the same against an installed wheel."""

from __future__ import annotations

import ast
import json
import os
import zipfile
from pathlib import Path

import pytest

from provisionerd import resources
from provisionerd.cli import main as cli_main
from provisionerd.demo import cluster

REPO = Path(__file__).resolve().parents[2]


def test_every_resource_is_where_the_package_says() -> None:
    assert resources.schema_dir() == REPO / "schemas"
    assert resources.require(resources.config_schema()) == REPO / "schemas" / "config.schema.json"
    assert resources.require(resources.wire_schema()) == REPO / "protocol" / "provisioner.capnp"
    for name in resources.PLUGINS:
        assert resources.plugin_dir(name) == REPO / "providers" / name
    # issue 32: the unit and the example config ship in the wheel too (docs/operations.md copies them from there).
    assert resources.require(resources.systemd_unit()) == REPO / "contrib" / "systemd" / "provisionerd.service"
    assert resources.require(resources.example_config()) == REPO / "docs" / "example-config.toml"


def test_every_shipped_plugin_is_listed() -> None:
    """A plugin directory (one with a ``provider`` executable or the ``<action>.sh`` scripts) under providers/ that
    PLUGINS does not name would be in the wheel but invisible to ``provider path``."""
    found = {
        str(d.relative_to(REPO / "providers"))
        for d in (REPO / "providers").rglob("*")
        if d.is_dir() and ((d / "provider").is_file() or (d / "requestMachines.sh").is_file())
    }
    assert found == set(resources.PLUGINS)


def test_no_module_locates_a_file_relative_to_its_source() -> None:
    """Runtime files come from ``provisionerd.resources``, not from ``__file__`` (which points into a checkout)."""
    offenders = []
    for package in ("provisionerd", "refcontroller"):
        for path in (REPO / package).rglob("*.py"):
            if "resources" in path.relative_to(REPO).parts[1:2]:
                continue  # its links lead to the plugins, whose code finds its own files
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "__file__"]
            offenders += [f"{path.relative_to(REPO)}:{n.lineno}" for n in names]
    assert offenders == []


def test_missing_files_are_named() -> None:
    with pytest.raises(resources.ResourceMissing, match="nothing.json is missing") as caught:
        resources.require(REPO / "schemas" / "nothing.json")
    assert isinstance(caught.value, FileNotFoundError)  # callers that handle OSError keep working
    with pytest.raises(resources.UnknownPlugin) as unknown:
        resources.plugin_dir("../../etc")
    assert "local" in unknown.value.known


def test_a_zipped_install_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    archive = tmp_path / "p.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("provisionerd/resources/__init__.py", "")
    monkeypatch.setattr(resources.resources, "files", lambda _: zipfile.Path(archive, "provisionerd/resources/"))
    with pytest.raises(resources.ResourceMissing, match="files on disk"):
        resources.root()


def test_the_demo_children_import_this_checkout() -> None:
    """From a checkout (editable or not installed at all) the demo's children get it on PYTHONPATH; from an
    installed wheel (test_wheel.py) nothing is added."""
    assert cluster.import_root() == REPO
    assert cluster.child_env()["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert cluster.LOCAL_PROVIDER == REPO / "providers" / "local"


def test_provider_path_prints_one_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["provider", "path", "examples/node"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == REPO / "providers" / "examples" / "node" and os.access(path / "provider", os.X_OK)
    assert cli_main.main(["provider", "path", "--json", "local"]) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "local", "path": str(REPO / "providers" / "local")}


def test_provider_path_lists_every_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["provider", "path", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert set(listing) == set(resources.PLUGINS)
    assert all(Path(row["path"]).is_dir() and row["about"] for row in listing.values())
    assert cli_main.main(["provider", "path"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in resources.PLUGINS)


def test_provider_path_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["provider", "path", "ec3"]) == 2
    err = capsys.readouterr().err
    assert "no shipped provider plugin named 'ec3'" in err and "aws_ec2" in err


def test_provider_path_reports_an_incomplete_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(resources, "root", lambda: tmp_path)
    assert cli_main.main(["provider", "path", "local"]) == 1
    assert "the install is incomplete" in capsys.readouterr().err
