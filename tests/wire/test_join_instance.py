"""``Join.instance`` (the provisioner's per-process name): it travels, and it is compatible both ways with a peer
built from the schema before the field existed (an older daemon or controller)."""

from __future__ import annotations

import re

import capnp
import pytest

from provisionerd.domain import model
from provisionerd.wire import codec
from provisionerd.wire import messages as m

#: The line that added the field; the "old" schema is the current one without it.
_FIELD = "  instance @6 :Text;"


@pytest.fixture(scope="module")
def old_schema(tmp_path_factory):
    text = codec.SCHEMA_PATH.read_text()
    lines = text.splitlines()
    # The schema before the field: without it and without every Join field added after it (ordinals stay dense).
    start = lines.index("struct Join {")
    end = lines.index("}", start)
    later = [i for i in range(start, end) if (f := re.match(r"  \w+ @(\d+) :", lines[i])) and int(f[1]) > 6]
    kept = [line for i, line in enumerate(lines) if not line.startswith(_FIELD) and i not in later]
    assert len(kept) == len(lines) - 1 - len(later), "the Join.instance line moved: update this test"
    # Another file id, so pycapnp can hold both schemas in one process (ids must be unique per loader).
    old = "\n".join(kept).replace("@0xb40be66711139fd0;", "@0xd40be66711139fd1;", 1)
    assert old != "\n".join(kept)
    path = tmp_path_factory.mktemp("old") / "provisioner_old.capnp"
    path.write_text(old + "\n")
    return capnp.load(str(path))


def test_a_join_with_an_instance_round_trips():
    join = m.Join(model.Role.PROVISIONER, "prov-a", providers=("aws",), instance="9f3c0a1b2c3d4e5f")
    got = codec.decode(codec.encode(join, corr=1))
    assert got == m.Envelope(1, join) and got.msg.instance == "9f3c0a1b2c3d4e5f"


def test_the_instance_defaults_to_empty():
    assert m.Join(model.Role.PROVISIONER, "prov-a").instance == ""
    assert codec.decode(codec.encode(m.Join(model.Role.ADMIN, "adm"))).msg.instance == ""


def test_an_old_peers_join_decodes_with_an_empty_instance(old_schema):
    frame = old_schema.Frame.new_message()
    frame.corr = 7
    join = frame.body.init("join")
    join.role = "provisioner"
    join.identity = "prov-a"
    join.protocolVersion = 1
    join.providers = ["aws"]
    got = codec.decode(frame.to_bytes())
    assert got == m.Envelope(7, m.Join(model.Role.PROVISIONER, "prov-a", providers=("aws",)))
    assert got.msg.instance == ""


def test_an_old_peer_reads_a_new_join_and_ignores_the_instance(old_schema):
    body = codec.encode(m.Join(model.Role.PROVISIONER, "prov-a", providers=("aws",), instance="abc"), corr=2)
    with old_schema.Frame.from_bytes(body) as frame:
        assert frame.corr == 2 and frame.body.which() == "join"
        assert (frame.body.join.identity, list(frame.body.join.providers)) == ("prov-a", ["aws"])
        assert "instance" not in old_schema.Join.schema.fields
