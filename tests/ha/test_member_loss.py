"""One etcd member loses its data and comes back as a fresh member: nothing visible to the daemon (issue 22 item 4).

Three replica processes on the three-member etcd, one daemon holding the lease with two machines of the simulated
provider (facts in the log). The etcd **leader** is killed (kill -9), its data dir removed, and it is replaced the
etcd way (``.ci/etcd-cluster replace``: ``member remove`` of its ID, ``member add`` of the same peer URL, etcd started
on an empty data dir with ``--initial-cluster-state existing``; it catches up from the new leader). Meanwhile the
daemon's status is read every 50 ms: its link stays up on the same primary, term and generation, its lease stays
held with the same epoch, no event but renewals; the controller's facts, term and incarnation are unchanged; the new
member serves the whole log.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, make_certs, simulated_provider
from rigs.etcd import failover_config, start_replica, wait_primary

from provisionerd.domain.model import DemandItem, ResourceShape
from refcontroller.admin import AdminClient
from refcontroller.store_etcd_client import EtcdClient

pytestmark = pytest.mark.integration

TTL, CHECK = 4.0, 1.0
#: Events a daemon writes when something reached it: none may appear while the member is replaced.
VISIBLE = {
    "link_down",
    "link_up",
    "redirect",
    "lease_lost",
    "lease_denied",
    "lease_acquired",
    "lease_freed",
    "controller_storage_failure",
    "controller_amnesia",
    "join_refused",
}


def leader_index(endpoints: tuple[str, ...]) -> int:
    """Which member (index into ``endpoints``) etcd's leader is."""
    for i, endpoint in enumerate(endpoints):
        client = EtcdClient((endpoint,), timeout=2)
        try:
            status = client.call("/v3/maintenance/status", {})
        finally:
            client.close()
        if status["leader"] == status["header"]["member_id"]:
            return i
    raise AssertionError("no member says it is the leader")


def serialized_next(endpoint: str, prefix: bytes) -> bytes:
    """``ops/next`` as one member holds it locally (a serializable read: not forwarded to the leader)."""
    import base64

    client = EtcdClient((endpoint,), timeout=2)
    try:
        key = base64.b64encode(prefix + b"ops/next").decode()
        reply = client.call("/v3/kv/range", {"key": key, "serializable": True})
    finally:
        client.close()
    (kv,) = reply["kvs"]
    return base64.b64decode(kv["value"])


def test_one_members_data_lost_and_replaced_is_invisible_to_the_daemon(tmp_path: Path, etcd_cluster) -> None:
    endpoints = etcd_cluster.endpoints
    certs = make_certs(tmp_path)
    seen: dict = {}

    def renewals_after(daemon: Daemon, since: float) -> int:
        return len([e for e in daemon.events("lease_renewed") if e["ts"] > since])

    async def main() -> None:
        async with procs.open_procs() as started:
            addresses = []
            for i in range(3):
                log = tmp_path / f"replica{i}.log"
                _, address = await start_replica(started, certs, etcd_cluster.store, log, ttl=TTL, check=CHECK)
                addresses.append(address)
            admin = AdminClient(certs, tuple(addresses), timeout=3)
            await wait_primary(admin)
            await admin.set_demand([DemandItem(demand_id="d1", shape=ResourceShape(ncpus=8), count=2)])
            provider = simulated_provider(tmp_path)  # its machines in tmp_path / "sim-data"
            state = tmp_path / "state"
            daemon = Daemon.write(failover_config(certs, addresses, state, provider), state / "pd.toml", started)
            await daemon.start()
            await daemon.wait_held()

            async def live_facts() -> bool:
                return (await admin.status())["facts"]["live"] >= 2

            await wait.until("the two machines' instance facts", live_facts, 60, interval=0.2)
            live_at = time.time()
            # Settled: two renewals since the facts (nothing pending, the renewals going).
            await wait.until_sync("two lease renewals after the facts", lambda: renewals_after(daemon, live_at) >= 2)
            seen["ctl_before"] = await admin.status()
            before = await daemon.wait_held()
            seen["before"] = before
            seen["events_before"] = len(daemon.events())
            member = leader_index(endpoints)
            seen["member"] = member
            samples: list[dict] = []

            async def sample() -> None:
                while True:
                    status = await daemon.status()
                    samples.append(status or {})
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                t0 = time.monotonic()
                seen["ids"] = await etcd_cluster.replace(member)
                seen["replace_s"] = time.monotonic() - t0
                # A renewal a whole TTL after the replacement: had one been disturbed, the lease would have lapsed.
                done = time.time()
                await wait.until_sync(
                    "a lease renewal a TTL after the replacement",
                    lambda: [e for e in daemon.events("lease_renewed") if e["ts"] > done + TTL],
                    3 * TTL,
                )
                nursery.cancel_scope.cancel()
            seen["samples"] = samples
            seen["after"] = await daemon.wait_held()
            seen["ctl_after"] = await admin.status()
            seen["events"] = daemon.events()[seen["events_before"] :]
            seen["machines"] = json.loads((provider.data_dir / "state.json").read_text())["machines"]

    trio.run(main)
    before, after = seen["before"], seen["after"]
    old_id, new_id = seen["ids"]
    print(
        f"etcd leader m{seen['member']} lost its data and was replaced ({old_id} -> {new_id}) in"
        f" {seen['replace_s']:.1f} s; {len(seen['samples'])} daemon status reads, events: "
        f"{sorted({e['event'] for e in seen['events']})}"
    )
    assert old_id != new_id
    # The daemon: every read saw the link up on the same primary, term and generation, the lease held, one epoch.
    assert len(seen["samples"]) > 50
    for status in seen["samples"]:
        assert status, "the daemon's admin socket did not answer"
        link = status["link"]
        assert link["state"] == "up", link
        assert (link["primary"], link["term"], link["generation"]) == (
            before["link"]["primary"],
            before["link"]["term"],
            before["link"]["generation"],
        )
        assert status["leases"][0]["state"] == "held"
        assert status["leases"][0]["epoch"] == before["leases"][0]["epoch"]
    assert after["controller"]["halted"] is False
    visible = [e for e in seen["events"] if e["event"] in VISIBLE]
    assert not visible, visible
    assert any(e["event"] == "lease_renewed" for e in seen["events"])  # renewals went on through the replacement
    # The controller: the same primary term, incarnation and facts; the provider: the same two machines.
    ctl_before, ctl_after = seen["ctl_before"], seen["ctl_after"]
    for key in ("term", "incarnation", "facts"):
        assert ctl_after[key] == ctl_before[key], key
    assert len(seen["machines"]) == 2
    # The new member holds the whole log (read locally on it, not through the leader).
    prefix = b"provisionerd/"
    new_member, other = etcd_cluster.endpoints[seen["member"]], etcd_cluster.endpoints[seen["member"] - 1]
    assert serialized_next(new_member, prefix) == serialized_next(other, prefix)
