"""Fuzzing provider output handling: the persistent transport's line splitter and answer parser, and the one-shot
transport's stdout handling (success and failure), on arbitrary bytes and arbitrary JSON documents.

Only the typed outcomes may come out: ``LineTooLong``/``BadFrame`` from the pure line layer, a validated document,
``ProviderProtocolViolation``, ``ProviderRejected`` or ``ProviderCrashed``; and a plugin cannot make the daemon
buffer more than its limits.
"""

from __future__ import annotations

import json
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisionerd.domain.errors import ProviderCrashed, ProviderProtocolViolation, ProviderRejected
from provisionerd.provider.lines import Answer, BadFrame, LineSplitter, LineTooLong, parse_answer
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.process import StderrTail
from provisionerd.provider.runtime import ProviderConfig, check_output, read_error_body
from provisionerd.provider.schemas import ACTIONS
from provisionerd.telemetry.redaction import Redactor

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25,
)
# Documents that look like answers: the right keys with arbitrary values, so validation is exercised deeply.
answer_like = st.dictionaries(
    st.sampled_from(
        [
            "requestId",
            "machines",
            "requests",
            "templates",
            "status",
            "message",
            "name",
            "version",
            "contractVersion",
            "features",
            "machineId",
            "error",
            "code",
        ]
    )
    | st.text(max_size=8),
    json_values,
    max_size=6,
)
actions = st.sampled_from(sorted(ACTIONS))


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(1, 200))
def test_the_line_splitter_returns_bounded_lines_or_refuses(chunks, limit):
    splitter = LineSplitter(limit)
    try:
        for chunk in chunks:
            for line in splitter.feed(chunk):
                assert b"\n" not in line and len(line) <= limit
    except LineTooLong as exc:
        assert exc.limit == limit


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        answer_like.map(lambda v: json.dumps(v).encode()),
    )
)
def test_an_answer_line_parses_or_is_a_bad_frame(line):
    try:
        answer = parse_answer(line)
    except BadFrame as exc:
        assert line.decode("utf-8", "replace")[:50] not in str(exc) or len(line) < 3  # never quotes the line
        return
    assert isinstance(answer, Answer) and isinstance(answer.id, int)


@FUZZ
@given(actions, st.one_of(json_values, answer_like))
def test_output_validation_returns_the_document_or_a_protocol_violation(action, document):
    try:
        out = check_output("p", action, document, Redactor())
    except ProviderProtocolViolation:
        return
    assert out is document


@FUZZ
@given(actions, st.one_of(json_values, answer_like))
def test_an_error_body_is_typed_or_ignored(action, body):
    typed = read_error_body("p", action, body, Redactor())
    assert typed is None or isinstance(typed, ProviderRejected)


ONE_SHOT = OneShotProvider(ProviderConfig(name="p", cluster="c", path="/nonexistent", credentials={"KEY": "s3cr3t-v"}))


@FUZZ
@given(
    actions,
    st.one_of(
        st.binary(max_size=400),
        answer_like.map(lambda v: json.dumps(v).encode()),
        st.just(b'{"error": {"code": "throttled", "message": "s3cr3t-v"}}'),
    ),
    st.integers(-64, 255),
)  # -34..-64: real-time signals
def test_one_shot_stdout_is_a_document_or_a_typed_error(action, stdout, returncode):
    tail = StderrTail(1024)
    redact = Redactor(frozenset({"s3cr3t-v"}))
    if returncode == 0:
        try:
            out = ONE_SHOT._success(action, stdout, tail, redact, validate=True)
        except ProviderProtocolViolation as exc:
            assert "s3cr3t-v" not in str(exc)
            return
        assert isinstance(out, dict)
        return
    error = ONE_SHOT._failure(action, returncode, stdout, tail, redact)
    assert isinstance(error, (ProviderRejected, ProviderCrashed))
    assert "s3cr3t-v" not in str(error)


def test_a_plugin_killed_by_a_realtime_signal_is_a_typed_crash():
    """Found by fuzzing: real-time signals are valid but not ``signal.Signals`` members (was ``ValueError``)."""
    error = ONE_SHOT._failure("requestMachines", -35, b"", StderrTail(1024), Redactor())
    assert isinstance(error, ProviderCrashed)
    assert "SIGRTMIN+1" in str(error)


def test_a_plugin_cannot_make_the_line_layer_hold_more_than_its_limit():
    splitter = LineSplitter(64 * 1024)
    chunk = b"x" * 4096
    tracemalloc.start()
    try:
        try:
            for _ in range(10_000):  # 40 MB without a newline
                splitter.feed(chunk)
        except LineTooLong:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 512 * 1024
