"""Each event kind's level (``telemetry.severity``), its text form (``telemetry.logfmt``), the daemon log's
collapse of repeated lines (``telemetry.log_collapse.Collapser``) and exception descriptions (issue 32 item 4)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
import trio

import provisionerd
from provisionerd.domain.errors import describe_error
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.log_collapse import Collapser
from provisionerd.telemetry.logfmt import fields_text
from provisionerd.telemetry.logging_setup import configure_logging
from provisionerd.telemetry.severity import SEVERITY, level_of

SOURCE = Path(provisionerd.__file__).parent


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def emitted_kinds() -> set[str]:
    """Every literal kind passed to an ``EventLog``'s ``emit`` in the package (the executor's step helper, whose
    first argument is a phase of ``action``, is not one), and the two the lease keeper picks by name."""
    kinds = set()
    for path in SOURCE.rglob("*.py"):
        for match in re.finditer(r"events\.emit\(\s*\"([a-z_]+)\"", path.read_text()):
            kinds.add(match.group(1))
    return kinds | {"lease_acquired", "lease_renewed"}


def test_every_kind_the_daemon_emits_has_its_level_in_the_table():
    kinds = emitted_kinds()
    assert {"link_down", "lease_lost", "provider_unhealthy", "orphan_pass"} <= kinds  # the scan finds them
    assert kinds - SEVERITY.keys() == set()


@pytest.mark.parametrize(
    "kind",
    [
        "link_down",
        "join_refused",
        "lease_lost",
        "provider_unhealthy",
        "controller_amnesia",
        "config_reload_failed",
        "controller_storage_failure",
    ],
)
def test_faults_are_warnings_or_errors(kind):
    assert level_of(kind) >= logging.WARNING


def test_the_routine_of_an_idle_fleet_is_debug_and_an_unknown_kind_info():
    for kind in ("lease_renewed", "refresh", "offers", "orphan_pass"):
        assert level_of(kind) == logging.DEBUG, kind
    assert level_of("lease_acquired") == logging.INFO
    assert level_of("never_heard_of") == logging.INFO


def test_event_lines_are_key_value_without_python_reprs():
    out = io.StringIO()
    configure_logging("debug", stream=out, text_format="%(levelname)s %(message)s")
    EventLog().emit(
        "provider_unhealthy",
        provider="ec2",
        code="auth_failed",
        detail='key "AKIA" refused\nby IAM',
        epoch=Epoch(3, 1),
        since=None,
        tags={"cluster": "c1", "slot": {"a": 1}},
        machines=("m1", "m2"),
        none=[],
        held=False,
    )
    EventLog().emit("daemon_stopped")
    assert out.getvalue().splitlines() == [
        'WARNING provider_unhealthy provider=ec2 code=auth_failed detail="key \\"AKIA\\" refused\\nby IAM" epoch=3.1'
        " tags.cluster=c1 tags.slot.a=1 machines=m1,m2 none=[] held=false",
        "INFO daemon_stopped",
    ]


def test_fields_text_quotes_what_a_logfmt_parser_would_split():
    assert fields_text({"a": "", "b": "x=y", "c": "tab\there", "d": 1.5}) == 'a="" b="x=y" c="tab\\there" d=1.5'


def test_an_event_below_the_level_is_not_formatted_or_written():
    out = io.StringIO()
    configure_logging("info", stream=out)
    EventLog().emit("lease_renewed", provider="ec2", epoch=Epoch(1, 1))
    assert out.getvalue() == ""


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("provisionerd.test", logging.WARNING, __file__, 1, message, None, None)


def test_copies_within_the_window_are_counted_and_written_once_when_it_ends():
    collapser = Collapser(window=60)
    written = []
    for t in (0, 10, 20, 59.5, 61, 130):
        written += [r.getMessage() for r in collapser.due(t)]
        if collapser.admit("k", record("cannot join"), t):
            written.append("cannot join")
    assert written == [
        "cannot join",  # t=0, window 0-60
        "cannot join (repeated 3 more times in 60 s)",  # due at 61, before the copy that opens the next window
        "cannot join",  # t=61, window 61-121
        "cannot join",  # t=130: the second window held nothing, so no count; a third one opens
    ]


def test_other_lines_pass_and_the_count_comes_out_at_the_next_line_or_at_close():
    collapser = Collapser(window=60)
    assert collapser.admit("a", record("a"), 0)
    assert not collapser.admit("a", record("a"), 1)
    assert collapser.admit("b", record("b"), 2)
    assert not collapser.admit("b", record("b"), 3)
    assert collapser.due(50) == []  # both windows still open
    summaries = collapser.due(61)  # a's window (0-60) ended, b's (2-62) not yet
    assert [(s.getMessage(), getattr(s, "repeated", None)) for s in summaries] == [
        ("a (repeated 1 more times in 60 s)", 1)
    ]
    assert [s.getMessage() for s in collapser.due(61.5, everything=True)] == ["b (repeated 1 more times in 60 s)"]


def test_the_keys_kept_are_bounded_and_the_oldest_counts_come_out_first():
    collapser = Collapser(window=60, limit=2)
    for key in ("a", "b"):
        collapser.admit(key, record(key), 0)
        collapser.admit(key, record(key), 1)
    collapser.admit("c", record("c"), 2)
    assert [s.getMessage() for s in collapser.due(3)] == ["a (repeated 1 more times in 60 s)"]


def test_a_collapse_window_must_be_positive():
    with pytest.raises(ValueError, match="collapse window must be positive, not 0"):
        Collapser(window=0)


def test_the_daemon_handler_collapses_and_writes_the_count_in_json_too():
    out = io.StringIO()
    now = [0.0]
    configure_logging("info", "json", stream=out, collapse=60, clock=lambda: now[0])
    log = logging.getLogger("provisionerd.test")
    for t in range(30):
        now[0] = float(t)
        log.warning("cannot join controller at %s", "ctl0:7400")
    now[0] = 61.0
    log.warning("something else")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert '"repeated": 29' in lines[1] and "(repeated 29 more times in 60 s)" in lines[1]
    assert '"something else"' in lines[2]


def test_an_exception_without_a_message_is_described():
    assert describe_error(trio.BrokenResourceError()) == (
        "BrokenResourceError: the connection was broken by the peer or the network"
    )
    assert describe_error(RuntimeError("disk full")) == "RuntimeError: disk full"
    assert describe_error(KeyError()) == "KeyError: no detail given"


def test_an_exception_without_a_message_is_described_by_its_cause():
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as exc:
            raise trio.BrokenResourceError from exc
    except trio.BrokenResourceError as broken:
        assert describe_error(broken) == (
            "BrokenResourceError: ConnectionResetError: [Errno 104] Connection reset by peer"
        )
