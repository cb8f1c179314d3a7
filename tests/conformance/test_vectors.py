"""The golden frames of ``protocol/vectors/``: one per message kind, checked both ways with the project's codec and
with the C++ ``capnp`` tool (the integration tier: ``make test-integration`` installs it; in CI a missing tool is a
failure)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from rigs import backends

from provisionerd.wire import codec
from provisionerd.wire.framing import frame_bytes
from provisionerd.wire.messages import MESSAGE_TYPES, Envelope

VECTORS_DIR = Path(__file__).resolve().parents[2] / "protocol" / "vectors"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vectors_generate", VECTORS_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
STEMS = sorted(GEN.VECTORS)


def _file(stem: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((VECTORS_DIR / f"{stem}.json").read_text())
    return document


def test_one_vector_per_message_kind_and_no_stray_file() -> None:
    kinds = {codec.opcode(cls) for cls in MESSAGE_TYPES}
    assert {_file(stem)["kind"] for stem in STEMS} == kinds
    assert sorted(p.stem for p in VECTORS_DIR.glob("*.json")) == STEMS


@pytest.mark.parametrize("stem", STEMS)
def test_our_codec_decodes_each_vector_to_its_value_and_encodes_it_to_the_same_bytes(stem: str) -> None:
    corr, msg = GEN.VECTORS[stem]
    document = _file(stem)
    body = bytes.fromhex(str(document["body_hex"]))
    assert codec.decode(body) == Envelope(corr, msg)
    assert (document["kind"], document["corr"]) == (codec.opcode(msg), corr)
    assert codec.encode(msg, corr) == body, "the codec's bytes moved: regenerate and say why"
    assert bytes.fromhex(str(document["frame_hex"])) == frame_bytes(body)


def _capnp(*args: str, stdin: bytes) -> bytes:
    done = subprocess.run(
        [backends.need("capnp", "Debian: capnproto"), *args], input=stdin, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


@pytest.mark.integration
@pytest.mark.parametrize("stem", STEMS)
def test_capnp_decodes_each_vector_to_its_text_and_encodes_the_text_to_its_value(stem: str) -> None:
    corr, msg = GEN.VECTORS[stem]
    document = _file(stem)
    body = bytes.fromhex(str(document["body_hex"]))
    schema = str(codec.SCHEMA_PATH)
    assert _capnp("decode", "--short", schema, "Frame", stdin=body).decode().strip() == document["text"]
    # The tool splits its text input into messages by counting parentheses, strings included: escape those.
    text = _STRING.sub(
        lambda s: s.group(0).replace(b"(", rb"\x28").replace(b")", rb"\x29"), str(document["text"]).encode()
    )
    assert codec.decode(_capnp("encode", schema, "Frame", stdin=text)) == Envelope(corr, msg)


@pytest.mark.process
@pytest.mark.integration  # the generator renders each vector's text with the capnp tool, a back end of that tier
def test_the_generator_check_says_the_files_are_current() -> None:
    backends.need("capnp", "Debian: capnproto")
    assert GEN.main(["--check"]) == 0
