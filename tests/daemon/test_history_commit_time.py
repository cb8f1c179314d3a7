"""The daemon's side of the controller's commit time (issue 32 item 7): a fact it commits is folded with the time
the controller's ack gives, and ``provisionerd history`` shows it: a header line, then a time column (UTC, to the
second; ``-`` when the controller does not say), and ``committed_at`` in ``--json``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from provisionerd.cli import history as cli
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session_settings import LinkState
from provisionerd.daemon.history_admin import fact_document
from provisionerd.domain.model import CommittedFact, Epoch, InstanceFact, Lost
from provisionerd.wire.messages import FactAck

E = Epoch(1, 1)
T = 1_765_000_000.75  # 2025-12-06T05:46:40.75Z
MADE = InstanceFact("aws", E, "op-1", "r-1", "m-1", "t.large", "h" * 64)
LOST = Lost("aws", E, "op-2", "m-1", "vanished")


def pages() -> list[dict[str, Any]]:
    """Two pages of the admin command's answer: a fact with its commit time, then one an older controller sent."""
    first = {"ok": True, "facts": [fact_document(CommittedFact(7, MADE, T))], "next_after": 7, "until_index": 9}
    second = {"ok": True, "facts": [fact_document(CommittedFact(9, LOST))], "next_after": 9, "until_index": 9}
    return [{**first, "done": False}, {**second, "done": True}]


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    replies = pages()
    monkeypatch.setattr(cli, "ask", lambda *_args, **_kwargs: replies.pop(0))
    assert cli.main(["--socket", "/nowhere/admin.sock", *argv]) == 0
    assert replies == []
    return capsys.readouterr().out.splitlines()


def test_the_history_lists_a_header_then_each_fact_with_when_it_was_committed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    header, made, lost = run(monkeypatch, capsys, "--all")  # the header once, whatever the number of pages
    assert header == cli.HEADER
    assert header.split() == ["INDEX", "COMMITTED", "(UTC)", "PROVIDER", "KIND", "OP", "ID", "ABOUT"]
    assert made.split() == ["7", "2025-12-06T05:46:40Z", "aws", "InstanceFact", "op-1", "m-1"]
    assert lost.split() == ["9", "-", "aws", "Lost", "op-2", "m-1"]  # an older controller's fact: not known
    # Each column starts under its title.
    for title in ("COMMITTED", "PROVIDER", "KIND", "OP ID"):
        column = header.index(title)
        assert made[column] != " " and made[column - 1] == " ", (title, made)


def test_the_history_as_json_has_the_commit_time_in_epoch_seconds_and_no_header(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made, lost = [json.loads(line) for line in run(monkeypatch, capsys, "--all", "--json")]
    assert (made["index"], made["committed_at"], made["kind"], made["machine_id"]) == (7, T, "InstanceFact", "m-1")
    assert (lost["index"], lost["committed_at"]) == (9, 0.0)


@pytest.mark.parametrize(
    ("at", "shown"),
    [
        (0.0, "-"),
        (None, "-"),
        (-1.0, "-"),
        (float("nan"), "-"),
        (True, "-"),
        (1e300, "1e+300"),
        (86400.5, "1970-01-02T00:00:00Z"),
    ],
)
def test_a_commit_time_is_shown_to_the_second_or_as_not_known(at: object, shown: str) -> None:
    assert cli.committed(at) == shown


def test_a_fact_the_daemon_commits_is_folded_with_the_time_of_the_controllers_ack() -> None:
    class Session:
        state = LinkState.UP
        controller_drains = True

        def __init__(self, ack: FactAck) -> None:
            self.ack = ack
            self.committed: list[CommittedFact] = []

        async def request(self, msg: object) -> FactAck:
            return self.ack

        def note_committed(self, committed: CommittedFact) -> None:
            self.committed.append(committed)

    async def main() -> None:
        for ack, expected in ((FactAck(4, T), CommittedFact(4, LOST, T)), (FactAck(5), CommittedFact(5, LOST))):
            session = Session(ack)
            assert await ControllerOps(session).commit(LOST) == ack.index  # type: ignore[arg-type]
            assert session.committed == [expected]

    trio.run(main)
