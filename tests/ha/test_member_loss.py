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
import sys
import time
from pathlib import Path

import pytest
import trio

from provisionerd.config.loader import ProviderConfig
from provisionerd.domain.model import DemandItem, ResourceShape
from refcontroller.admin import AdminClient
from refcontroller.store_etcd_client import EtcdClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ha_procs import (  # noqa: E402
    SIMULATED,
    daemon_config,
    events_of,
    held,
    make_certs,
    poll_status,
    primary_status,
    start_daemon,
    start_replica,
    status_of,
    stop,
    store_url,
)

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
    store = store_url(endpoints)
    seen: dict = {}

    async def main() -> None:
        replicas: list[trio.Process] = []
        daemon = None
        try:
            addresses = []
            for i in range(3):
                proc, address = await start_replica(certs, store, tmp_path / f"replica{i}.log", ttl=TTL, check=CHECK)
                replicas.append(proc)
                addresses.append(address)
            admin = AdminClient(certs, tuple(addresses), timeout=3)
            await primary_status(admin)
            await admin.set_demand([DemandItem(demand_id="d1", shape=ResourceShape(ncpus=8), count=2)])
            data = tmp_path / "sim-data"
            provider = ProviderConfig("sim", "oneshot", path=SIMULATED, data_dir=data)
            state = tmp_path / "state"
            config = daemon_config(certs, addresses, state, provider)
            daemon = await start_daemon(config, tmp_path / "pd.toml", tmp_path / "daemon.log")
            sock = state / "admin.sock"
            await poll_status(sock, held)
            with trio.fail_after(60):
                while (await admin.status())["facts"]["live"] < 2:  # noqa: ASYNC110 - another process's state
                    await trio.sleep(0.2)
            await trio.sleep(2 * TTL)  # settled: a few renewals, nothing pending
            seen["ctl_before"] = await admin.status()
            before = await poll_status(sock, held)
            seen["before"] = before
            seen["events_before"] = len(events_of(state))
            member = leader_index(endpoints)
            seen["member"] = member
            samples: list[dict] = []

            async def sample() -> None:
                while True:
                    status = await status_of(sock)
                    samples.append(status or {})
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                t0 = time.monotonic()
                replaced = await trio.run_process(etcd_cluster.replace_command(member), capture_stdout=True)
                seen["replace_s"] = time.monotonic() - t0
                seen["ids"] = replaced.stdout.decode().split()
                await trio.sleep(2 * TTL)  # any renewal the loss disturbed would show by now
                nursery.cancel_scope.cancel()
            seen["samples"] = samples
            seen["after"] = await poll_status(sock, held)
            seen["ctl_after"] = await admin.status()
            seen["events"] = events_of(state)[seen["events_before"] :]
            seen["machines"] = json.loads((data / "state.json").read_text())["machines"]
        finally:
            if daemon is not None:
                await stop(daemon)
            for proc in replicas:
                await stop(proc)

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
