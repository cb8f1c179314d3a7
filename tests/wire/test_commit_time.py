"""``CommittedFact.committedAt`` and ``FactAck.committedAt`` (the controller's commit time, issue 32 item 7): they
travel through both readers (the reference path and the native one), and they are compatible both ways with a peer
built from the schema before the fields existed: its frames decode with 0 ("not known"), and it reads ours."""

from __future__ import annotations

import capnp
import pytest

from provisionerd.domain import model
from provisionerd.wire import codec, native
from provisionerd.wire import messages as m

E = model.Epoch(3, 7)
FACT = model.Lost("aws", E, "op-4", "m-2", "vanished")
#: The lines that added the fields (each with its comment's continuation line); the "old" schema is without them.
_FIELDS = ("  committedAt @2 :Float64;", "  committedAt @1 :Float64;")


@pytest.fixture(scope="module")
def old_schema(tmp_path_factory):
    lines = codec.SCHEMA_PATH.read_text().splitlines()
    kept: list[str] = []
    for line in lines:
        if line.startswith(_FIELDS) or (kept and kept[-1] is None and line.lstrip().startswith("#")):
            kept.append(None)  # type: ignore[arg-type]
            continue
        kept.append(line)
    old = [line for line in kept if line is not None]
    assert len(old) == len(lines) - 4, "the committedAt lines moved: update this test"
    # Another file id, so pycapnp can hold both schemas in one process (ids must be unique per loader).
    text = "\n".join(old).replace("@0xb40be66711139fd0;", "@0xd40be66711139fd2;", 1)
    path = tmp_path_factory.mktemp("old") / "provisioner_before_commit_times.capnp"
    path.write_text(text + "\n")
    schema = capnp.load(str(path))
    assert "committedAt" not in schema.CommittedFact.schema.fields and "committedAt" not in schema.FactAck.schema.fields
    return schema


def both_readers(body: bytes) -> m.Envelope:
    """The frame as the reference path reads it, checked equal to what ``decode`` gives (native when built)."""
    before = codec.NATIVE_HANDED_BACK[0]
    reference, _ = codec.decode_reference(body)
    assert codec.decode(body) == reference
    if native.load() is not None:
        assert codec.NATIVE_HANDED_BACK[0] == before, "the native reader handed the frame back"
    return reference


@pytest.mark.parametrize(
    "msg",
    [
        m.ResyncPage(0, 1, (model.CommittedFact(41, FACT, 1765000000.25), model.CommittedFact(42, FACT)), (), True, 42),
        m.HistoryPage((model.CommittedFact(42, FACT, 1765000003.75),), 42, 42, True),
        m.FactAck(43, 1765000002.5),
        m.FactAck(44),
    ],
    ids=["resyncPage", "historyPage", "factAck", "factAck_unknown"],
)
def test_the_commit_time_round_trips_through_both_readers(msg: m.Message) -> None:
    assert both_readers(codec.encode(msg, 5)) == m.Envelope(5, msg)


def test_the_commit_time_defaults_to_not_known() -> None:
    assert model.CommittedFact(1, FACT).committed_at == 0.0 and m.FactAck(1).committed_at == 0.0


def test_an_old_controllers_resync_page_and_ack_decode_with_no_commit_time(old_schema) -> None:
    # What an older controller sends: CommittedFact and FactAck without the field, built from its schema.
    reference = codec.encode(m.ResyncPage(0, 1, (model.CommittedFact(41, FACT, 1.0),), (), True, 41), 9)
    with old_schema.Frame.from_bytes(reference) as new_frame:  # the same values, laid out by the old schema
        old_body = old_schema.Frame.new_message(**new_frame.to_dict()).to_bytes()
    assert old_body != reference
    got = both_readers(old_body)
    assert got == m.Envelope(9, m.ResyncPage(0, 1, (model.CommittedFact(41, FACT),), (), True, 41))
    assert got.msg.facts[0].committed_at == 0.0

    ack = old_schema.Frame.new_message()
    ack.corr = 3
    ack.body.init("factAck").index = 43
    assert both_readers(ack.to_bytes()) == m.Envelope(3, m.FactAck(43))

    history = old_schema.Frame.new_message()
    history.corr = 4
    page = history.body.init("historyPage")
    page.init("facts", 1)[0].index = 42
    page.facts[0].fact.provider = "aws"
    page.facts[0].fact.epoch.term, page.facts[0].fact.epoch.seq = 3, 7
    page.facts[0].fact.opId = "op-4"
    page.facts[0].fact.init("lost").machineId = "m-2"
    page.facts[0].fact.lost.reason = "vanished"
    page.nextAfter = page.untilIndex = 42
    page.done = True
    got = both_readers(history.to_bytes())
    assert got == m.Envelope(4, m.HistoryPage((model.CommittedFact(42, FACT),), 42, 42, True))


def test_an_old_peer_reads_our_frames_and_ignores_the_commit_time(old_schema) -> None:
    page = m.ResyncPage(0, 1, (model.CommittedFact(41, FACT, 1765000000.25),), (), True, 41)
    with old_schema.Frame.from_bytes(codec.encode(page, 2)) as frame:
        (fact,) = frame.body.resyncPage.facts
        assert (fact.index, fact.fact.opId, fact.fact.lost.machineId) == (41, "op-4", "m-2")
        assert frame.body.resyncPage.asOf == 41
    with old_schema.Frame.from_bytes(codec.encode(m.FactAck(43, 1765000002.5), 3)) as frame:
        assert (frame.corr, frame.body.which(), frame.body.factAck.index) == (3, "factAck", 43)
