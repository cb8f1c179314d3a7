"""The grace after a promotion with real processes: two daemons, three replica processes, kill -9 of the primary.

Issue 22's first "Done when": after kill -9 of the primary replica, "the lease re-granted to the same holder at once
and to a different holder only after the grace". Two ``provisionerd run`` processes serve one provider with one
identity (each its own state directory): A holds the lease, B is a standby (denied ``held``).

- ``holder alive``: kill -9 of the primary only. A holds the new primary's lease while the grace still runs; B is
  not granted it at any point.
- ``holder killed``: kill -9 of the primary and of A together. B rejoins the new primary, is denied ``grace``, and is
  granted only once the grace (``TTL + T_check`` from the promotion) is over: after A's last lease lapsed on A's
  own clock.

Times compared are wall clocks of this host (the daemons' event ``ts``, the test's ``time.time()``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from ha.sim_compare import real_grace_outcome, sim_grace_outcome
from rigs import procs, wait
from rigs.daemon import Daemon, lease_held, make_certs, stub_plugin
from rigs.etcd import failover_config, start_replica, wait_primary

from provisionerd.config.loader import ProviderConfig
from provisionerd.domain.model import Epoch
from refcontroller.admin import AdminClient, AdminError

pytestmark = pytest.mark.integration

TTL, CHECK = 4.0, 1.0
GRACE_S = TTL + CHECK


async def _new_primary(admin: AdminClient, term: int, limit: float = 20.0) -> tuple[dict, float]:
    """The new primary's status once its term is above ``term``, and the wall time its grace ends (at the latest:
    the query's send time + the grace it had left)."""

    async def probe() -> tuple[dict, float] | None:
        sent = time.time()
        try:
            status = await admin.status()
        except (AdminError, OSError):
            return None
        return (status, sent + status["grace_remaining_s"]) if status["term"] > term else None

    return await wait.until(f"a primary of a term above {term}", probe, limit)


def _lease_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"].startswith("lease_")]


@pytest.mark.parametrize("holder", ["alive", "killed"])
def test_after_kill_9_of_the_primary_the_same_holder_at_once_another_only_after_the_grace(
    tmp_path: Path, etcd_cluster, holder: str
) -> None:
    certs = make_certs(tmp_path)
    provider = ProviderConfig("sim", "oneshot", path=stub_plugin(tmp_path))
    seen: dict = {}

    async def main() -> None:
        async with procs.open_procs() as started:
            replicas: dict[str, procs.Proc] = {}
            for i in range(3):
                log = tmp_path / f"replica{i}.log"
                proc, address = await start_replica(started, certs, etcd_cluster.store, log, ttl=TTL, check=CHECK)
                replicas[address] = proc
            addresses = tuple(replicas)
            first = await wait_primary(AdminClient(certs, addresses, timeout=3))
            daemons = {}
            for name in "ab":
                config = failover_config(certs, addresses, tmp_path / name, provider)
                daemons[name] = Daemon.write(config, tmp_path / name / "pd.toml", started)
                await daemons[name].start()
                if name == "a":
                    seen["a_before"] = await daemons["a"].wait_held()
            await wait.until_sync(
                "B denied the lease A holds",
                lambda: [e for e in daemons["b"].events() if e.get("reason") == "held"],
                20,
            )
            primary = seen["a_before"]["link"]["primary"]
            old_term = seen["a_before"]["link"]["term"]
            assert primary in replicas and old_term == first["term"]
            seen["killed_at"] = time.time()
            replicas[primary].kill9()
            if holder == "killed":
                assert daemons["a"].proc is not None
                daemons["a"].proc.kill9()
            others = AdminClient(certs, tuple(a for a in addresses if a != primary), timeout=3)
            seen["ctl"], seen["grace_ends"] = await _new_primary(others, old_term)
            if holder == "alive":
                seen["a_after"] = await daemons["a"].wait_status(
                    "A holding a lease of the new term",
                    lambda s: lease_held(s) and Epoch.parse(s["leases"][0]["epoch"]).term > old_term,
                )
                seen["a_regained"] = time.time()
                await trio.sleep(GRACE_S + 1.0)  # a window past the grace: B stays denied (A renews)
            else:
                seen["b_after"] = await daemons["b"].wait_held(limit=2 * GRACE_S + 10)
            seen["ctl_end"] = await others.status()
            seen["window_end"] = time.time()
            seen["events"] = {name: daemon.events() for name, daemon in daemons.items()}

    trio.run(main)
    a_events, b_events = seen["events"]["a"], seen["events"]["b"]
    killed_at, grace_ends = seen["killed_at"], seen["grace_ends"]
    new_term = seen["ctl"]["term"]
    b_acquired = [e for e in b_events if e["event"] == "lease_acquired"]
    (lease,) = seen["ctl_end"]["leases"]
    # The simulation's controller model, given the same fault plan (sim_compare), decides the same.
    real = real_grace_outcome(a_events, b_events, new_term, grace_ends, seen["window_end"])
    simulated = sim_grace_outcome(holder_killed=holder == "killed")
    print(f"outcome: real {real}, simulated {simulated}")
    assert real == simulated
    if holder == "alive":
        regained = seen["a_regained"] - killed_at
        early = grace_ends - seen["a_regained"]
        print(
            f"holder alive: A held the new lease {regained:.2f} s after the kill, {early:.2f} s before the grace ended"
        )
        assert seen["a_regained"] < grace_ends  # re-granted at once: inside the grace
        assert not b_acquired, b_acquired  # B never held it
        assert lease["holder"] == f"prov-ha#{seen['a_before']['link']['instance']}"
        assert Epoch.parse(seen["a_after"]["leases"][0]["epoch"]).term == new_term
    else:
        # A's last lease, on A's own clock: its last grant or renewal before the kill, plus what it had left.
        last = [e for e in _lease_events(a_events) if e["event"] in ("lease_acquired", "lease_renewed")][-1]
        a_valid_until = last["ts"] + last["valid_for"]
        (acquired,) = b_acquired
        denials = [e for e in b_events if e["event"] == "lease_denied" and e["ts"] > killed_at]
        print(
            f"holder killed: B denied {[d['reason'] for d in denials]}; B held {acquired['ts'] - killed_at:.2f} s after"
            f" the kill, {acquired['ts'] - grace_ends:+.3f} s from the grace's end,"
            f" {acquired['ts'] - a_valid_until:.2f} s after A's last lease lapsed"
        )
        assert any(d["reason"] == "grace" for d in denials), denials
        assert acquired["ts"] >= grace_ends - 0.01  # a different holder only after the grace
        assert acquired["ts"] > a_valid_until  # never while A's lease could still be running
        assert Epoch.parse(acquired["epoch"]).term == new_term
        assert lease["holder"] == f"prov-ha#{seen['b_after']['link']['instance']}"
