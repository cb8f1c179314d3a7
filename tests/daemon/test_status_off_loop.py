"""The daemon's admin ``status`` makes its pass over a large view off the loop (``StatusSnapshot.refresh``, the
socket's ``prepare``): found by bench/steady.py, whose status queries at 100,000 machines held the loop 164-271 ms
in one step (the pass made inline) each time the view had changed, because the daemon never handed the socket its
``prepare``."""

from __future__ import annotations

import threading

import trio
import trio.testing
from rigs.daemon import short_dir
from rigs.lease_holder import holding_lease
from rigs.memory import memory_config, memory_core, open_memory_controller, running

from provisionerd.daemon import status_snapshot
from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import NO_EPOCH, InstanceFact, RequestIntent
from provisionerd.testing.fake_provider import FakeProvider


def test_a_status_query_passes_over_a_large_view_in_a_worker_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(status_snapshot, "OFF_LOOP_AT", 2)  # "large" from 2 machines, as 5,000 are at the default
    made_in: list[int] = []
    made = status_snapshot._Pass.of

    def spy(parts):
        made_in.append(threading.get_ident())
        return made(parts)

    monkeypatch.setattr(status_snapshot._Pass, "of", spy)
    seen: dict = {}

    async def main():
        seen["loop_thread"] = threading.get_ident()  # under pytest-xdist, not always the main thread
        async with open_memory_controller(tmp_path, 1, ttl=30.0) as net:
            config = memory_config(tmp_path, net.addresses, admin_socket=socket)
            refs = ("clu/op-1/0", "clu/op-1/1", "clu/op-1/2")
            async with holding_lease(config, "sim", net.connect, identity="someone-before") as holder:
                await holder.commit(
                    RequestIntent("sim", NO_EPOCH, "op-1", "small", 3, refs, ("a" * 64, "b" * 64, "c" * 64)),
                    *(
                        InstanceFact("sim", NO_EPOCH, "op-1", r, f"i-{n}", "small", "abc"[n] * 64)
                        for n, r in enumerate(refs)
                    ),
                )
            core = memory_core(net, config, FakeProvider("sim"))
            async with running(core):
                with trio.fail_after(30):
                    # Polling: the session has no event for "the view holds these facts".
                    while core.session.view is None or len(core.session.view.facts.machines) < 3:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                seen["status"] = await trio.to_thread.run_sync(query, socket)
                seen["off_loop"] = core.observability.snapshot.passes_off_loop
                seen["passes"] = core.observability.snapshot.passes

    with short_dir("pd-st-") as sockets:  # a tmp_path may be too long for a unix socket
        socket = sockets / "admin.sock"
        # The holder's lease waits out the controller's start grace (30 s): trio's clock jumps it; it jumps only
        # after 10 ms with nothing to run, so never inside the query (a thread on a real socket, ~1 ms).
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.01))
    assert seen["status"]["ok"] is True and seen["status"]["status"]["providers"]["sim"]
    assert seen["off_loop"] >= 1 and seen["passes"] == seen["off_loop"]  # the query's pass, by refresh; none inline
    assert made_in and seen["loop_thread"] not in made_in
