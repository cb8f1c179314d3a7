"""Reading the join token (file rules, bounds) and the rejoin proof derived from it."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from provisionerd.agent.token import (
    REJOIN_PREFIX,
    read_token_file,
    read_token_stream,
    rejoin_credential,
    rejoin_hash,
    rejoin_hash_of_credential,
    rejoin_proof,
)
from provisionerd.domain.errors import ConfigError

TOKEN = "Abc-def_0123456789xyzXYZ"


def write(path: Path, content: str, mode: int) -> Path:
    path.write_text(content)
    os.chmod(path, mode)
    return path


def test_a_0600_file_is_read_and_deleted(tmp_path: Path) -> None:
    path = write(tmp_path / "token", TOKEN + "\n", 0o600)
    assert read_token_file(path) == TOKEN
    assert not path.exists()
    assert read_token_file(write(tmp_path / "t2", TOKEN, 0o400)) == TOKEN


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o610])
def test_a_file_others_may_read_is_refused_and_left_in_place(tmp_path: Path, mode: int) -> None:
    path = write(tmp_path / "token", TOKEN, mode)
    with pytest.raises(ConfigError, match=f"{mode:04o}") as refused:
        read_token_file(path)
    assert path.exists() and TOKEN not in str(refused.value)


def test_symlinks_directories_missing_files_and_bad_content_are_refused(tmp_path: Path) -> None:
    target = write(tmp_path / "real", TOKEN, 0o600)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        read_token_file(tmp_path / "link")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_token_file(tmp_path)
    with pytest.raises(ConfigError, match="cannot open"):
        read_token_file(tmp_path / "missing")
    for bad in ("short", "x" * 600, "two words here xxxxxxxx", "ünïcode-token-xxxxxxxxxx", ""):
        path = write(tmp_path / "bad", bad, 0o600)
        with pytest.raises(ConfigError) as refused:
            read_token_file(path)
        assert bad not in str(refused.value) or bad == ""


def test_stream_reading_is_bounded() -> None:
    assert read_token_stream(io.BytesIO(TOKEN.encode() + b"\r\n")) == TOKEN
    with pytest.raises(ConfigError, match="more than a join token"):
        read_token_stream(io.BytesIO(b"y" * 100_000))
    with pytest.raises(ConfigError):
        read_token_stream(io.BytesIO(b""))


def test_the_rejoin_proof_is_bound_to_token_and_instance() -> None:
    proof = rejoin_proof(TOKEN, "c1/i-1")
    assert proof == rejoin_proof(TOKEN, "c1/i-1") and len(proof) == 64 and TOKEN not in proof
    assert proof != rejoin_proof(TOKEN, "c1/i-2")
    assert proof != rejoin_proof(TOKEN + "x", "c1/i-1")
    credential = rejoin_credential(TOKEN, "c1/i-1")
    assert credential.startswith(REJOIN_PREFIX) and ":" not in TOKEN
    assert rejoin_hash_of_credential(credential) == rejoin_hash(TOKEN, "c1/i-1") != proof
    assert rejoin_hash_of_credential(TOKEN) is None
    assert rejoin_hash_of_credential(REJOIN_PREFIX + "zz") is None
