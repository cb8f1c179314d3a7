"""A resync leaves the session's replies prompt (#18): pages decoded from the store in steps, each page written only
once the socket has drained (refcontroller/pacing.py), and the store's JSON read on its fast path."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from rc_client import memory_controller, on_mock_clock, on_real_clock
from rc_factories import instance, intent
from rigs import procs

from provisionerd.domain.model import (
    FACT_TYPES,
    DrainRequested,
    Epoch,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    PriceQuote,
    RequestFailed,
    Returned,
    ReturnIntent,
    Role,
)
from provisionerd.wire.messages import DemandPage, JoinReply, ResyncPage, ResyncRequest
from refcontroller import cluster as cluster_module
from refcontroller import jsonconv, pacing
from refcontroller import session as session_module
from refcontroller.jsonconv import JsonDocumentError, fact_from_json, fact_to_json

E = Epoch(1, 1)


def _facts(n: int) -> list[object]:
    out: list[object] = []
    for i in range(n):
        out.append(intent("aws", E, f"op-{i}", refs=(f"r{i}",)))
        out.append(instance("aws", E, f"r{i}", f"op-{i}"))
    return out


@on_mock_clock
async def test_a_page_is_decoded_from_the_store_a_step_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No task step of the session decodes more than ``DECODE_STEP`` stored facts (a page of ~390 facts was one
    step: 5-8 ms of CPU in which no heartbeat was answered), and the pages still hold every fact in order."""
    decoded_in_step = [0]
    most = [0]
    real = cluster_module.fact_from_json

    def counting(text: str) -> object:
        decoded_in_step[0] += 1
        most[0] = max(most[0], decoded_in_step[0])
        return real(text)

    class PerStep(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            decoded_in_step[0] = 0

    monkeypatch.setattr(cluster_module, "fact_from_json", counting)
    async with memory_controller(tmp_path) as h:
        h.cluster.store.append_many(_facts(600), "d1")  # type: ignore[arg-type]
        peer, reply = await h.join(Role.PROVISIONER, providers=("aws",))
        assert isinstance(reply, JoinReply) and reply.accepted
        assert isinstance(await peer.push(), DemandPage)
        trio.lowlevel.add_instrument(PerStep())
        await peer.framed.send(ResyncRequest(("aws",)), 7)
        pages: list[ResyncPage] = []
        while not pages or len(pages) < pages[0].page_count:
            envelope = await peer.receive_envelope()
            if isinstance(envelope.msg, ResyncPage):
                pages.append(envelope.msg)
    assert len(pages) >= 2 and max(len(p.facts) for p in pages) > cluster_module.DECODE_STEP
    assert [c.index for p in pages for c in p.facts] == list(range(1, 1201))
    assert 0 < most[0] <= cluster_module.DECODE_STEP


@on_mock_clock
async def test_each_page_waits_for_the_socket_to_drain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session waits on ``pacing.until_drained`` of its own stream before it writes each page (made while the
    previous one drains)."""
    events: list[str] = []
    real_drained = session_module.until_drained

    async def drained(stream: trio.abc.Stream) -> None:
        events.append("drained")
        await real_drained(stream)

    real_steps = cluster_module.Cluster.resync_facts_in_steps

    def steps(self: cluster_module.Cluster, plan: cluster_module.ResyncPlan, page: int, step: int = 100):  # type: ignore[no-untyped-def]
        events.append(f"page {page}")
        return real_steps(self, plan, page, step)

    monkeypatch.setattr(session_module, "until_drained", drained)
    monkeypatch.setattr(cluster_module.Cluster, "resync_facts_in_steps", steps)
    async with memory_controller(tmp_path) as h:
        h.cluster.store.append_many(_facts(600), "d1")  # type: ignore[arg-type]
        peer, _ = await h.join(Role.PROVISIONER, providers=("aws",))
        await peer.push()
        await peer.framed.send(ResyncRequest(("aws",)), 7)
        count = None
        seen = 0
        while count is None or seen < count:
            envelope = await peer.receive_envelope()
            if isinstance(envelope.msg, ResyncPage):
                count, seen = envelope.msg.page_count, seen + 1
    assert count is not None and count >= 2
    assert events == [e for page in range(count) for e in (f"page {page}", "drained")]


async def _tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            stream = await listeners[0].accept()
            accepted.append(stream)  # type: ignore[arg-type]

        nursery.start_soon(accept)
        client = await trio.open_tcp_stream("127.0.0.1", port)
    await listeners[0].aclose()
    return client, accepted[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIOCOUTQNSD is Linux's")
@on_real_clock
async def test_until_drained_waits_while_the_peer_reads_nothing() -> None:
    sender, receiver = await _tcp_pair()
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # a window that fills at once
    async with sender, receiver:
        assert pacing.unsent_bytes(sender) == 0
        with trio.move_on_after(2):
            await sender.send_all(b"x" * (1 << 20))  # the window fills, then the send buffer: unsent bytes stay
        unsent = pacing.unsent_bytes(sender)
        assert unsent is not None and unsent > pacing.LOW_WATER
        with trio.move_on_after(0.05) as waited:
            await pacing.until_drained(sender)
        assert waited.cancelled_caught  # nothing read, nothing drained: still waiting

        async def read_all() -> None:
            while await receiver.receive_some(1 << 16):
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            with trio.fail_after(10):
                await pacing.until_drained(sender)
            left = pacing.unsent_bytes(sender)
            assert left is not None and left <= pacing.LOW_WATER
            nursery.cancel_scope.cancel()


@on_mock_clock
async def test_until_drained_returns_at_once_without_a_socket() -> None:
    left, _ = trio.testing.memory_stream_pair()
    assert pacing.unsent_bytes(left) is None
    with trio.fail_after(1):
        await pacing.until_drained(left)


# --- the store's JSON fast path ---------------------------------------------------------------------------------


def _every_kind() -> list[object]:
    quote = PriceQuote(0.25, "USD", "hour", "list", "2026-01-01T00:00:00Z")
    return [
        intent("aws", E, "op-1", refs=("a", "b")),
        instance("aws", E, "a"),
        InstanceFact("aws", E, "op-1", "b", "m-b", "t1", "h", "host", "10.0.0.1", 12.5, quote),
        RequestFailed("aws", E, "op-2", "capacity"),
        ReturnIntent("aws", E, "ret-1", ("m-a", "m-b"), "idle"),
        Returned("aws", E, "ret-1", ("m-a",), 99.0),
        Lost("aws", E, "lost-1", "m-b", "gone"),
        OrphanReported("aws", E, "orph-1", "stray", "ghost", "{}"),
        OrphanAdopted("aws", E, "adopt-1", "stray", "ref-s", "h", "10.0.0.9"),
        DrainRequested("aws", E, "drain-1", ("m-a",), "max_ttl", 5.0),
    ]


def test_every_fact_kind_has_a_fast_path_that_gives_what_cattrs_gives() -> None:
    facts = _every_kind()
    assert {type(f) for f in facts} == set(FACT_TYPES)
    assert set(jsonconv._FAST_FACTS) == {t.__name__ for t in FACT_TYPES}
    for fact in facts:
        text = fact_to_json(fact)  # type: ignore[arg-type]
        fast = jsonconv._FAST_FACTS[type(fact).__name__](json.loads(text))
        assert fast == fact and type(fast) is type(fact)
        assert fact_from_json(text) == jsonconv._structure(json.loads(text), jsonconv.Fact, "fact") == fact


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(launch_time=5),  # an int for a float: cattrs coerces
        lambda d: d.update(hostname=7),  # an int for a text: cattrs coerces
        lambda d: d.pop("hostname"),  # a field with a default left out
        lambda d: d.update(epoch={"term": 1, "seq": True}),  # a bool for an int
        lambda d: d["price"].update(amount=1),
    ],
)
def test_a_document_off_the_written_shape_is_read_by_cattrs(change: object) -> None:
    doc = json.loads(fact_to_json(InstanceFact("aws", E, "op", "r", "m", "t", "h", "host", "10.0.0.1", 1.5)))
    change(doc)  # type: ignore[operator]
    assert jsonconv._FAST_FACTS["InstanceFact"](doc) is jsonconv._MISSING or "hostname" not in doc
    expected = jsonconv._structure(json.loads(json.dumps(doc)), jsonconv.Fact, "fact")
    assert fact_from_json(json.dumps(doc)) == expected


@pytest.mark.parametrize(
    "doc",
    [
        {"kind": ["InstanceFact"]},  # an unhashable tag
        {"kind": "InstanceFact", "provider": "aws"},  # fields missing
        {
            "kind": "Lost",
            "provider": "aws",
            "epoch": {"term": 1, "seq": 1, "x": 1},
            "op_id": "o",
            "machine_id": "m",
            "reason": "r",
        },  # an unknown key in a nested struct
        {
            "kind": "Lost",
            "provider": "aws",
            "epoch": {"term": 1, "seq": 1},
            "op_id": "o",
            "machine_id": "m",
            "reason": "r",
            "surprise": 1,
        },  # an unknown key
        {"kind": "Nope"},
        [1, 2],
    ],
)
def test_a_bad_document_is_refused_as_cattrs_refuses_it(doc: object) -> None:
    with pytest.raises(JsonDocumentError):
        fact_from_json(json.dumps(doc))


_SERVE_FREEZES = """
import gc, os, signal, trio
from refcontroller import cli

class Running:
    addresses = ("127.0.0.1:1",)
    class server:
        class cluster:
            term = 1
            class store:
                incarnation = "i"

async def run(task_status=trio.TASK_STATUS_IGNORED):
    task_status.started(Running())
    await trio.sleep_forever()

def ready(*args, **kwargs):  # the ready line: the controller is serving
    print(gc.get_freeze_count(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

cli.announce = ready
print(gc.get_freeze_count(), flush=True)
trio.run(cli._serve_until_signalled, run, {})
"""


@pytest.mark.process
def test_a_serving_controller_freezes_its_startup_heap() -> None:
    """``refcontroller serve`` freezes what it holds once started (a full collection during a big resync held its
    loop 20-30 ms of CPU), in its own process only."""
    done = procs.run([sys.executable, "-c", _SERVE_FREEZES], timeout=60)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert before == 0 and after > 10_000
