"""Handover without a gap, with real processes on loopback (issue 22 item 5).

The reference controller runs as a process (mutual TLS); two ``provisionerd run`` processes serve one provider with
the same identity (one config on two hosts: each its own state directory). The holder's SIGTERM releases the lease;
the controller pushes ``LeaseFreed`` to the standby, which acquires at once (measured: ``lease_acquired`` of the
standby against ``daemon_stopping`` of the holder, both wall clocks of this host). A second start of the holder's
own config while it runs is refused (exit 2, naming the holder's pid), and the holder keeps answering ``status``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, stub_plugin

from provisionerd.config.loader import ProviderConfig

pytestmark = pytest.mark.process

#: The controller's lease: long enough that waiting out a hint (up to the whole TTL) could never pass for a push.
TTL = 10.0
#: Request and heartbeat timeouts of 3 s (the rig's other test timings otherwise); the lease margin is 1 s.
LINK = {"request_timeout": 3, "heartbeat_timeout": 3}


def test_sigterm_of_the_holder_hands_the_lease_over_and_a_second_start_is_refused(tmp_path: Path) -> None:
    from refcontroller.api import open_refcontroller_process

    certs = make_certs(tmp_path)
    provider = ProviderConfig("sim", "oneshot", path=stub_plugin(tmp_path))
    seen: dict = {}

    async def main() -> None:
        async with (
            open_refcontroller_process(
                certs, tmp_path / "ctl", replicas=1, lease_ttl=TTL, check_interval=0.5, heartbeat_timeout=5.0
            ) as ctl,
            procs.open_procs() as started,
        ):
            daemons = []
            for name in "ab":  # one identity and provider, each its own state directory
                (tmp_path / name).mkdir()
                config = daemon_config(
                    certs, ctl.addresses, tmp_path / name, provider, identity="prov-ha", margin=1.0, link=LINK
                )
                daemons.append(Daemon.write(config, tmp_path / name / "pd.toml", started))
            a, b = daemons
            holder = await a.start()
            seen["first"] = await a.wait_held()
            # The same config again, while the first runs: refused, the first keeps its socket.
            again = await a.start()
            await wait.until_sync("the second start to exit", lambda: again.returncode is not None, 20)
            seen["again_rc"] = again.returncode
            seen["again_err"] = again.log.read_text()
            seen["first_after"] = await a.wait_held(limit=5)
            # The standby: another state directory, the same identity and provider.
            standby = await b.start()
            await b.wait_status("B's link up", lambda s: s["link"]["state"] == "up")
            await b.wait_event("lease_denied", 20)  # from here the standby waits on its hint (most of the TTL)
            holder.terminate()
            await wait.until_sync("the holder to exit on SIGTERM", lambda: holder.returncode is not None, 15)
            seen["holder_rc"] = holder.returncode
            seen["standby"] = await b.wait_held(limit=TTL)
            seen["controller"] = await ctl.status()
            seen["standby_rc"] = await standby.stop(15)
            seen["pids"] = [holder.pid, again.pid, standby.pid]
            seen["events"] = [a.events(), b.events()]

    trio.run(main)
    holder_pid, again_pid, standby_pid = seen["pids"]
    # The second start of one config: exit 2 and a message naming the process that holds the socket.
    assert seen["again_rc"] == 2
    assert f"in use by process {holder_pid}" in seen["again_err"], seen["again_err"]
    assert seen["first_after"]["process"]["pid"] == holder_pid
    a_events, b_events = seen["events"]
    assert {e["process"]["pid"] for e in a_events} == {holder_pid}  # nothing from the refused start
    assert {e["process"]["instance"] for e in a_events} == {seen["first"]["link"]["instance"]}
    assert {e["process"]["pid"] for e in b_events} == {standby_pid}
    # The handover: SIGTERM of the holder -> the standby holds, within 0.5 s, without waiting out its hint.
    assert seen["holder_rc"] == 0
    stopping = next(e["ts"] for e in a_events if e["event"] == "daemon_stopping")
    acquired = next(e["ts"] for e in b_events if e["event"] == "lease_acquired")
    gap = acquired - stopping
    print(f"handover: standby held {gap * 1000:.0f} ms after the holder's SIGTERM")
    assert 0 < gap < 0.5, gap
    assert any(e["event"] == "lease_freed" for e in b_events)
    denial = next(e for e in b_events if e["event"] == "lease_denied")
    assert denial["reason"] == "held" and denial["retry_after"] > 3
    (lease,) = seen["controller"]["leases"]
    assert lease["holder"] == f"prov-ha#{seen['standby']['link']['instance']}"
