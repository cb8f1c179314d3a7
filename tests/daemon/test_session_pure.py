"""Pure pieces of the session: demand assembly, resync collection, backoff, the status rendering."""

from __future__ import annotations

import json
import random

import pytest
import trio

from provisionerd.cli.status import main as status_main
from provisionerd.cli.status import render
from provisionerd.config.loader import Backoff
from provisionerd.controller.backoff import BackoffTimer
from provisionerd.controller.view import DemandAssembler, ResyncCollector
from provisionerd.daemon.admin_socket import query, serve_admin_socket
from provisionerd.domain.errors import ProtocolError
from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    Lost,
    RequestIntent,
    ResourceShape,
)
from provisionerd.planner.host_table import join_index


def item(n: int) -> DemandItem:
    return DemandItem(demand_id=f"d{n}", shape=ResourceShape(), count=n)


def test_demand_pages_in_any_order_make_one_snapshot_and_older_ones_are_ignored():
    a = DemandAssembler()
    assert a.add(5, 1, 3, (item(2),)) is None
    assert a.add(5, 0, 3, (item(1),)) is None
    assert a.add(5, 0, 3, (item(1),)) is None  # a duplicate page changes nothing
    snapshot = a.add(5, 2, 3, (item(3),))
    assert snapshot is not None and snapshot.seq == 5 and [i.count for i in snapshot.items] == [1, 2, 3]
    assert a.add(4, 0, 1, (item(9),)) is None  # older: level-triggered, ignored
    assert a.add(5, 0, 1, ()) is None  # a replay of the same seq too
    assert a.add(7, 0, 2, (item(1),)) is None
    newest = a.add(8, 0, 1, ())  # a newer snapshot abandons the unfinished 7
    assert newest is not None and newest.seq == 8 and newest.items == ()


@pytest.mark.parametrize("page,count", [(0, 0), (3, 3), (-1, 2), (0, 10_001)])
def test_demand_pages_out_of_range_are_protocol_errors(page, count):
    with pytest.raises(ProtocolError):
        DemandAssembler().add(1, page, count, ())


def test_demand_page_count_may_not_change_within_a_snapshot():
    a = DemandAssembler()
    a.add(1, 0, 2, ())
    with pytest.raises(ProtocolError, match="page count"):
        a.add(1, 1, 3, ())


def test_resync_collector_folds_facts_in_log_order_and_keys_hosts():
    lost = [CommittedFact(i, Lost("sim", Epoch(1, 1), f"op{i}", f"m{i}", "gone")) for i in (1, 2, 3)]
    host = HostState("ref-1", "sim", "m1", HostStatus.IDLE, 1.0)
    c = ResyncCollector()
    assert not c.add(1, 2, (lost[2],), (host,))
    assert c.add(0, 2, (lost[0], lost[1]), ())
    view = c.build(generation=4, primary="ctl0:1", term=2)
    assert view.generation == 4 and view.facts.last_index == 3 and view.hosts == {"ref-1": host}
    assert view.demand is None and not view.complete
    with pytest.raises(ProtocolError):
        ResyncCollector().add(2, 2, (), ())


def test_resync_view_keeps_its_hosts_in_the_fact_views_indexed_table():
    """The daemon's plan pass reads the kept join index, not a scan of every host, from the first resync on."""
    epoch = Epoch(1, 1)
    refs = ("ref-0", "ref-1", "ref-2")
    intent = RequestIntent("sim", epoch, "op", "t", 3, refs, ("0" * 64,) * 3, "d1")
    facts = [CommittedFact(1, intent)] + [
        CommittedFact(2 + i, InstanceFact("sim", epoch, "op", ref, f"m{i}", "t", "0" * 64, launch_time=5.0))
        for i, ref in enumerate(refs)
    ]
    c = ResyncCollector()
    assert c.add(
        0,
        1,
        tuple(facts),
        (HostState("ref-0", "sim", "m0", HostStatus.IDLE, 1.0), HostState("ref-1", "sim", "m1", HostStatus.BUSY, 1.0)),
    )
    view = c.build(generation=1, primary="ctl0:1", term=1)
    assert view.hosts is view.facts.hosts
    index = join_index(view.facts.active_refs, view.hosts)
    assert index is view.facts.hosts  # the kept index, not one built for this pass
    assert set(index.unjoined) == {"ref-2"} and set(index.available["d1"]) == {"ref-0"}
    # A later push goes through the same table and keeps its indexes right.
    view.apply_hosts([HostState("ref-2", "sim", "m2", HostStatus.IDLE, 2.0)])
    assert not index.unjoined and set(index.available["d1"]) == {"ref-0", "ref-2"}


def test_backoff_is_seeded_jittered_exponential_and_capped():
    settings = Backoff(initial=0.5, max=8.0, multiplier=2.0, jitter=0.5)
    a, b = BackoffTimer(settings, random.Random(3)), BackoffTimer(settings, random.Random(3))
    delays = [a.next_delay() for _ in range(10)]
    assert delays == [b.next_delay() for _ in range(10)]
    bases = [0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8]
    assert all(base * 0.5 <= d <= base for d, base in zip(delays, bases, strict=True))
    a.reset()
    assert a.next_delay() <= 0.5
    for _ in range(2000):  # a long outage neither overflows nor exceeds the cap
        assert a.next_delay() <= 8.0


def test_status_is_served_on_the_admin_socket_and_rendered(tmp_path, capsys):
    sock = tmp_path / "a" / "admin.sock"
    document = {
        "cluster": "c",
        "identity": "p",
        "link": {"state": "up", "primary": "ctl0:1", "term": 3, "generation": 2, "demand_seq": 7, "last_error": ""},
        "leases": [
            {"provider": "sim", "state": "held", "epoch": "3.1", "remaining": 12.5, "reason": "renewed"},
            {"provider": "aws", "state": "lapsed", "epoch": "2.4", "remaining": None, "reason": "x"},
        ],
    }
    codes: list[int] = []

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, sock, lambda: document)
            reply = await trio.to_thread.run_sync(query, sock)
            assert reply == {"ok": True, "status": document}
            codes.append(await trio.to_thread.run_sync(status_main, ["--socket", str(sock)]))
            codes.append(await trio.to_thread.run_sync(status_main, ["--socket", str(sock), "--json"]))
            bad = await trio.to_thread.run_sync(query, sock, "reboot")
            assert bad["ok"] is False
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert codes == [0, 0]
    out = capsys.readouterr().out
    human, _, raw = out.partition("{")
    assert "link: up  primary: ctl0:1  term: 3" in human
    assert "provider 'sim': held  epoch 3.1  valid for 12.5s" in human
    assert "provider 'aws': lapsed  epoch 2.4  not valid" in human
    assert json.loads("{" + raw) == document
    assert not sock.exists()  # removed on exit
    assert status_main(["--socket", str(sock)]) == 1  # nobody there
    assert render(document)[0] == "daemon 'p' of cluster 'c'"
