"""Cross-check against the C++ reference implementation (`capnp`, Debian's capnproto): it accepts the schema,
reads what our codec writes, and writes what our codec reads.

The integration tier (`make test-integration` installs the tool; in CI a missing tool is a failure).
"""

from __future__ import annotations

import re
import struct
import subprocess

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rigs import backends
from wire_strategies import MESSAGE_STRATEGIES, u64

from provisionerd.domain import model
from provisionerd.wire import codec
from provisionerd.wire import messages as m

pytestmark = pytest.mark.integration

SCHEMA = str(codec.SCHEMA_PATH)


def _capnp(*args: str, stdin: bytes) -> bytes:
    done = subprocess.run(
        [backends.need("capnp", "Debian: capnproto"), *args], input=stdin, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def _split_messages(data: bytes) -> list[bytes]:
    """Cut a stream of standard-serialization messages at their boundaries (read from each segment table)."""
    out = []
    while data:
        (count_minus_one,) = struct.unpack_from("<I", data)
        count = count_minus_one + 1
        sizes = struct.unpack_from(f"<{count}I", data, 4)
        table = 4 + 4 * count
        table += -table % 8
        end = table + 8 * sum(sizes)
        out.append(data[:end])
        data = data[end:]
    return out


def test_capnp_compile_accepts_the_schema():
    assert _capnp("compile", "-o-", SCHEMA, stdin=b"")  # the CodeGeneratorRequest, non-empty


def test_capnp_decodes_our_bytes_to_the_expected_text():
    body = codec.encode(m.LeaseGrant("aws", model.Epoch(2, 7), 15000), corr=5)
    text = _capnp("decode", "--short", SCHEMA, "Frame", stdin=body).decode()
    expected = '(corr = 5, body = (leaseGrant = (provider = "aws", epoch = (term = 2, seq = 7), ttlMs = 15000)))'
    assert text.strip() == expected


def test_we_decode_what_capnp_encodes_from_text():
    text = (
        b'(corr = 3, body = (join = (role = worker, identity = "w-1", protocolVersion = 1, providers = [],'
        b' instanceRef = "i-9", token = "t0k")))'
        b'(body = (rejected = (reason = staleEpoch, detail = "epoch 1.2 is not current")))'
    )
    bodies = _split_messages(_capnp("encode", SCHEMA, "Frame", stdin=text))
    assert [codec.decode(b) for b in bodies] == [
        m.Envelope(3, m.Join(model.Role.WORKER, "w-1", 1, (), "i-9", "t0k")),
        m.Envelope(0, m.Rejected("stale_epoch", "epoch 1.2 is not current")),
    ]


@given(
    batch=st.tuples(*MESSAGE_STRATEGIES.values()),
    corrs=st.lists(u64, min_size=len(MESSAGE_STRATEGIES), max_size=len(MESSAGE_STRATEGIES)),
)
@settings(
    max_examples=5,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking through subprocesses takes minutes
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_every_kind_survives_a_trip_through_the_cpp_implementation(batch, corrs):
    # Ours -> capnp decode (binary to text) -> capnp encode (text to binary) -> ours: both implementations must
    # agree on every field of every message kind. The text goes back one message per call because the tool
    # splits several messages by counting parentheses, even inside strings.
    bodies = b"".join(codec.encode(msg, corr) for msg, corr in zip(batch, corrs, strict=True))
    lines = _capnp("decode", "--short", SCHEMA, "Frame", stdin=bodies).splitlines()
    again = [_capnp("encode", SCHEMA, "Frame", stdin=_escape_parens(line)) for line in lines]
    assert [codec.decode(body) for body in again] == [m.Envelope(c, msg) for msg, c in zip(batch, corrs, strict=True)]


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _escape_parens(line: bytes) -> bytes:
    """Write parentheses inside string literals as ``\\x28``/``\\x29``: the tool splits its text input into
    messages by counting parentheses, strings included, so ``"a)b"`` would end a message early."""
    return _STRING.sub(lambda m: m.group(0).replace(b"(", rb"\x28").replace(b")", rb"\x29"), line)
