"""The SDK's atomic private-file writer, its configuration loader and its data directory: modes, atomicity, typed
errors and the one contract code for a broken configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provisionerd.plugin_sdk import atomic, config, datadir
from provisionerd.plugin_sdk.errors import PluginError


@pytest.fixture
def open_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def test_the_writer_replaces_a_file_as_0600_whatever_the_umask(tmp_path: Path, open_umask: None) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    os.chmod(target, 0o644)
    atomic.write_private_json(target, {"b": 1, "a": [2]}, sort_keys=True)
    assert target.read_text() == '{"a":[2],"b":1}'
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        atomic.write_private_json(target, {"not json": object()})
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic.write_private(tmp_path / "adir", b"x")  # the rename fails after the temporary was written
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "state.json"]


def test_the_writer_never_writes_through_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr(atomic, "_serial", iter([7]))
    (tmp_path / f".state.json.{os.getpid()}.7.tmp").symlink_to(victim)
    with pytest.raises(OSError):
        atomic.write_private(tmp_path / "state.json", b"new")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        (lambda d: None, config.ConfigUnreadable),  # missing
        (lambda d: (d / "p.json").mkdir(), config.ConfigUnreadable),  # a directory
        (lambda d: (d / "p.json").write_bytes(b"{" * (config.MAX_CONFIG_BYTES + 1)), config.ConfigTooLarge),
        (lambda d: (d / "p.json").write_text("not json"), config.ConfigNotJson),
        (lambda d: (d / "p.json").write_bytes(b"\xff\xfe"), config.ConfigNotJson),
    ],
)
def test_a_config_that_cannot_be_read_is_a_typed_provider_error(tmp_path: Path, setup, error) -> None:
    """Unreadable is the plugin's set-up, not the daemon's request: provider_error, never invalid_request."""
    setup(tmp_path)
    with pytest.raises(error) as caught:
        config.load_config("p.json", {"PRO_CONF_DIR": str(tmp_path)})
    assert caught.value.code == "provider_error" and not caught.value.retryable
    assert caught.value.path == str(tmp_path / "p.json") and str(tmp_path / "p.json") in caught.value.message


def test_an_unset_conf_dir_and_an_invalid_document_are_typed_too(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigNotSet) as unset:
        config.load_config("p.json", {})
    assert unset.value.code == "provider_error" and "PRO_CONF_DIR" in unset.value.message
    (tmp_path / "p.json").write_text('{"n": "three"}')
    doc, path = config.load_config("p.json", {"PRO_CONF_DIR": str(tmp_path)})
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n", "m"]}
    with pytest.raises(config.ConfigInvalid) as invalid:
        config.check_schema(schema, doc, path.name)
    assert invalid.value.code == "provider_error"
    assert invalid.value.message.startswith("p.json: (top): 'm' is a required property; n: 'three' is not of type")
    assert len(invalid.value.problems) == 2


def test_one_table_maps_every_config_error_to_its_contract_code() -> None:
    kinds = {config.ConfigNotSet, config.ConfigUnreadable, config.ConfigTooLarge, config.ConfigNotJson}
    assert kinds | {config.ConfigInvalid, config.ConfigError} == set(config.CONTRACT_CODE)
    assert {kind("x").code for kind in kinds} == {"provider_error"}


def test_the_data_directory_and_its_private_subdirectories(tmp_path: Path, open_umask: None) -> None:
    with pytest.raises(PluginError) as unset:
        datadir.data_dir({})
    assert unset.value.code == "provider_error"
    root = datadir.data_dir({"PRO_DATA_DIR": str(tmp_path / "data")})
    (root / "b").mkdir(parents=True, mode=0o755)
    datadir.private_dirs(root, ("a", "b"))
    assert {(root / n).stat().st_mode & 0o777 for n in "ab"} == {0o700}
    (tmp_path / "file").write_text("")
    with pytest.raises(PluginError, match="cannot use the data directory"):
        datadir.private_dirs(tmp_path / "file", ("a",))
    assert datadir.record_name("op-1") == datadir.record_name("op-1") != datadir.record_name("op-2")
    assert len(datadir.record_name("../../etc", 32)) == 32 and "/" not in datadir.record_name("../../etc")
