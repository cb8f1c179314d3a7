"""Issue 20 items 1-2 and issue 35 items 1-2 with real processes: the reference controller (in this process, real
mutual-TLS sockets), ``provisionerd run`` and the local provider's plugin and agents (processes, the real clock).

The local provider's templates declare one GPU; each agent runs its template's probe (``--probe ngpus=...``, from
the plugin's own ``local.json``) and reports what it printed in its Join. ``gpu-bad`` (the cheaper, chosen first)
probes ``echo 0``; ``gpu-good`` probes ``echo 1``.

1. Demand 1 GPU machine: the ``gpu-bad`` machine joins, is returned with ``capability_mismatch: ngpus 0 < 1
   required`` in its ReturnIntent, and the demand is met by a ``gpu-good`` machine.
2. ``max_unhealthy = 1``, only ``gpu-bad`` offered (``capacity_backoff = 1``: without the protection the daemon
   would ask again every second), demand 3: three bad machines come back, replacement stops, and ``provisionerd
   status`` says why; no request is made for the next seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from local_driver import local_conf, local_provider
from rigs import procs, wait
from rigs.agents import live_agents
from rigs.daemon import Daemon, daemon_config, short_dir

from provisionerd.config.loader import Backoff
from provisionerd.demo.procs import LOCAL_HOME_LABEL
from provisionerd.domain.model import (
    DemandItem,
    InstanceFact,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
)
from refcontroller.api import RefController, open_refcontroller

pytestmark = pytest.mark.process

GPU = ResourceShape(ncpus=1, gpus=1)


def template(template_id: str, price: float, gpus_seen: str) -> dict[str, Any]:
    return {
        "templateId": template_id,
        "maxNumber": 8,
        "ncpus": 1,
        "memMb": 64,
        "ngpus": 1,
        "price": price,
        "probes": {"ngpus": f"echo {gpus_seen}"},
        "reportHost": True,  # ncpus 1, mem 64 MiB: this host has them, so only the GPU probe can fall short
    }


@attrs.frozen
class Rig:
    ctl: RefController
    daemon: Daemon

    def facts(self, kind: type) -> list[Any]:
        return [(c.index, c.fact) for c in self.ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]

    def hosts(self) -> dict[str, Any]:
        return {h.instance_ref: h for h in self.ctl.server.cluster.hosts.all()}

    def settled(self) -> bool:
        """Every request op closed (as many machines as it asked for, or failed) and every machine it made
        returned, as the controller's facts say."""
        made: dict[str, int] = {}
        for _, fact in self.facts(InstanceFact):
            made[fact.op_id] = made.get(fact.op_id, 0) + 1
        failed = {fact.op_id for _, fact in self.facts(RequestFailed)}
        closed = all(f.op_id in failed or made.get(f.op_id, 0) >= f.count for _, f in self.facts(RequestIntent))
        returned = {m for _, fact in self.facts(Returned) for m in fact.machine_ids}
        return closed and all(fact.machine_id in returned for _, fact in self.facts(InstanceFact))

    async def until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            await wait.until_sync(what, predicate, timeout, 0.1)
        except wait.WaitTimeout as exc:
            assert self.daemon.proc is not None
            raise wait.WaitTimeout(f"{exc}\n{self.daemon.proc.tail()}") from None


@asynccontextmanager
async def fleet(
    tmp_path: Path, certs: Path, templates: list[dict[str, Any]], env: dict[str, str] | None = None, **options: Any
) -> AsyncIterator[Rig]:
    """The controller, the daemon (its lease held, ``env`` added to its environment and so its agents') and the
    local provider; on exit, demand 0, every agent gone and the daemon stopped cleanly."""
    provider = local_provider(tmp_path, local_conf(certs, templates=templates), idle_time=0, **options)
    with short_dir("pd-hl-") as state:
        async with (
            open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl,
            procs.open_procs() as started,
        ):
            config = daemon_config(
                certs,
                ctl.addresses,
                state,
                provider,
                cluster="agentcluster",
                identity="prov-health",
                link={"connect_timeout": 5.0, "backoff": Backoff(initial=0.1, max=0.5)},
            )
            daemon = Daemon.write(config, tmp_path / "pd.toml", started)
            proc = await daemon.start(env=env)
            await daemon.wait_held(60)
            rig = Rig(ctl, daemon)
            yield rig
            await ctl.set_demand([])
            # Every request settled and every machine it made returned before the agents are counted: a request
            # still in flight (a replacement) would start an agent after an early "none left" (seen under load).
            await wait.until_sync("every request settled, every machine returned", rig.settled, 60, 0.2)
            await wait.until_sync("every agent gone", lambda: not live_agents(str(tmp_path)), 30, 0.2)
            assert await proc.stop(20) == 0, proc.tail(60)


async def within(seconds: float, main: Callable[[], Any]) -> None:
    with trio.fail_after(seconds):
        await main()


def test_a_machine_whose_probe_reports_0_gpus_is_returned_with_the_reason_and_replaced(
    certs: Path, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        templates = [template("gpu-bad", 0.1, "0"), template("gpu-good", 0.2, "1")]
        async with fleet(tmp_path, certs, templates) as rig:
            started = time.monotonic()
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 1)])

            hosts_seen: dict[str, Any] = {}
            seen["hosts"] = hosts_seen

            def met() -> bool:
                hosts_seen.update(rig.hosts())  # a returned machine's host is dropped with its lifecycle
                returned = {m for _, f in rig.facts(Returned) for m in f.machine_ids}
                good = [h for h in rig.hosts().values() if h.capabilities.get("ngpus") == "1"]
                return bool(returned) and len(good) == 1 and good[0].status.value == "idle"

            await rig.until(met, 90, "the bad machine returned and a good one joined")
            seen["seconds"] = time.monotonic() - started
            seen["intents"] = [f for _, f in rig.facts(RequestIntent)]
            seen["returns"] = [f for _, f in rig.facts(ReturnIntent)]
            await trio.sleep(3)  # the demand stays met: nothing more is asked or returned
            seen["intents_later"] = len(rig.facts(RequestIntent))
            seen["returns_later"] = len(rig.facts(ReturnIntent))
            seen["events"] = rig.daemon.events()

    trio.run(within, 180, main)
    assert [(i.template_id, i.count) for i in seen["intents"]] == [("gpu-bad", 1), ("gpu-good", 1)]
    (back,) = seen["returns"]
    assert back.reason == "capability_mismatch: ngpus 0 < 1 required"
    bad_host = next(h for h in seen["hosts"].values() if h.capabilities.get("ngpus") == "0")
    assert back.machine_ids == (bad_host.machine_id,)
    assert set(bad_host.capabilities) == {"ncpus", "mem", "type", "ngpus"}
    assert seen["intents_later"] == 2 and seen["returns_later"] == 1
    notes = [e for e in seen["events"] if e["event"] == "plan_note" and e["kind"] == "capability_mismatch"]
    assert notes and "ngpus 0 < 1 required" in notes[0]["detail"]
    print(f"bad machine returned and demand met by a good one in {seen['seconds']:.2f} s")


def test_with_max_unhealthy_1_three_bad_machines_stop_replacement_and_status_says_why(
    certs: Path, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        # A count as TOML writes it: the loader reads it as "1", which the writer would render as a string the
        # schema refuses (a count must be an integer, only "N%" a string).
        options = {"max_unhealthy": 1, "max_unhealthy_window": 600, "capacity_backoff": 1}
        async with fleet(tmp_path, certs, [template("gpu-bad", 0.1, "0")], **options) as rig:
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 3)])

            async def protected() -> bool:
                status = await rig.daemon.status()
                machines = None if status is None else status["providers"]["local"]["health"].get("machines")
                seen["machines"] = machines
                return bool(machines and machines["protected"])

            await wait.until("the provider protected", protected, 90, 0.1)
            intents = len(rig.facts(RequestIntent))
            await rig.until(
                lambda: (
                    not any(h.status.value != "lost" for h in rig.hosts().values()) and not live_agents(str(tmp_path))
                ),
                60,
                "every bad machine returned",
            )
            await trio.sleep(5)  # five suspect back-offs: without the protection the daemon would ask again
            seen["intents_before"] = intents
            seen["intents_after"] = [f for _, f in rig.facts(RequestIntent)]
            seen["returns"] = [f for _, f in rig.facts(ReturnIntent)]
            seen["status"] = await rig.daemon.status()
            seen["events"] = rig.daemon.events()

    trio.run(within, 200, main)
    machines = seen["machines"]
    assert machines["unhealthy"] >= 2 and machines["max_unhealthy"] == 1
    assert "more than max_unhealthy 1: replacement stopped" in machines["reason"]
    assert len(seen["intents_after"]) == seen["intents_before"]  # replacement stopped
    asked = sum(i.count for i in seen["intents_after"])
    returned = {m for r in seen["returns"] for m in r.machine_ids}
    assert asked >= 3 and len(returned) == asked  # every bad machine went back
    assert all(r.reason == "capability_mismatch: ngpus 0 < 1 required" for r in seen["returns"])
    health = seen["status"]["providers"]["local"]["health"]["machines"]
    assert health["protected"] is True and health["eases_in_s"] > 500 and health["unhealthy"] == asked
    flagged = [e for e in seen["events"] if e["event"] == "plan_note" and e["kind"] == "provider_protected"]
    assert flagged and "replacement stopped" in flagged[-1]["detail"]
    print(f"protected after {asked} bad machines: {machines['reason']}")


def _home_of(pid: int) -> Path:
    """The local plugin's data directory an agent runs in (its ``--label`` names it: ``procs.LOCAL_HOME_LABEL``)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    label = next(a.decode() for a in argv if a.decode().startswith(f"{LOCAL_HOME_LABEL}="))
    return Path(label.partition("=")[2])


def test_a_machine_that_degrades_after_its_join_is_replaced_and_still_counted_after_a_restart(
    certs: Path, tmp_path: Path
) -> None:
    """Issue 35 item 2 with real processes: each agent re-probes every 10 s (``reprobeInterval``) with a probe that
    reads a flag file of its own (``gpus.<its pid>`` in the plugin's data directory; none: 1 GPU). The test flips
    the first machine's to 0 after it joined: its next re-probe reaches the daemon through the controller, which
    returns it as ``unhealthy_after_join`` and has a replacement join. ``max_unhealthy`` counts the finding, and a
    daemon restarted afterwards still counts it (the window read back from the facts)."""
    seen: dict[str, Any] = {}

    async def main() -> None:
        probe = {"ngpus": "cat gpus.$PPID 2>/dev/null || echo 1"}
        templates = [{**template("gpu", 0.1, "1"), "probes": probe, "reprobeInterval": 10}]
        options = {"max_unhealthy": 2, "max_unhealthy_window": 600}
        async with fleet(tmp_path, certs, templates, **options) as rig:
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 1)])
            await rig.until(lambda: len(rig.hosts()) == 1, 60, "the first machine joined")
            (first,) = rig.hosts().values()
            (pid,) = live_agents(str(tmp_path))
            (_home_of(pid) / f"gpus.{pid}").write_text("0\n")
            flipped = time.monotonic()

            def replaced() -> bool:
                returns = [f for _, f in rig.facts(ReturnIntent)]
                others = [h for h in rig.hosts().values() if h.instance_ref != first.instance_ref]
                return bool(returns) and len(others) == 1 and others[0].capabilities.get("ngpus") == "1"

            await rig.until(replaced, 90, "the degraded machine returned and a replacement joined")
            seen["replaced_s"] = time.monotonic() - flipped
            seen["returns"] = [f for _, f in rig.facts(ReturnIntent)]
            (seen["first"],) = [
                f.machine_id for _, f in rig.facts(InstanceFact) if f.instance_ref == first.instance_ref
            ]

            async def counted() -> bool:
                status = await rig.daemon.status()
                machines = None if status is None else status["providers"]["local"]["health"].get("machines")
                return bool(machines) and machines["unhealthy"] == 1

            await wait.until("the finding counted", counted, 30, 0.1)
            assert rig.daemon.proc is not None
            assert await rig.daemon.proc.stop(20) == 0
            await rig.daemon.start()
            await rig.daemon.wait_held(60)
            await wait.until("the finding still counted after the restart", counted, 60, 0.2)
            seen["restored"] = rig.daemon.events("windows_restored")

    trio.run(within, 240, main)
    (back,) = seen["returns"]
    assert back.machine_ids == (seen["first"],)
    assert back.reason == "unhealthy_after_join: ngpus 0 < 1 required"
    assert seen["restored"] and seen["restored"][-1]["unhealthy"] == 1
    print(f"degraded machine replaced {seen['replaced_s']:.1f} s after its probe flipped (re-probe every 10 s)")


def _without_gpu_runtime(tmp_path: Path) -> dict[str, str]:
    """A ``PATH`` on which no ``nvidia-smi`` answers (this host has none; a fake one that is not executable shadows
    any other), so the agents' shipped GPU probe measures nothing."""
    shadow = tmp_path / "no-gpu"
    shadow.mkdir()
    (shadow / "nvidia-smi").write_text("not a tool\n")  # mode 0644: shutil.which passes it by
    return {"PATH": f"{shadow}:{os.environ['PATH']}"}


def unprobed(template_id: str) -> dict[str, Any]:
    """A 1-GPU template whose agents have no GPU probe of their own: the shipped one (nvidia-smi) is all they run."""
    return {"templateId": template_id, "maxNumber": 8, "ncpus": 1, "memMb": 64, "ngpus": 1, "price": 0.1}


def test_a_machine_whose_report_omits_its_templates_gpus_is_replaced_unless_the_template_is_unverified(
    certs: Path, tmp_path: Path
) -> None:
    """Issue 35 item 1 with real processes. The agents report this host's ncpus, mem and type by default, and no
    ngpus (no GPU runtime answers here): the machine is returned ``capability_mismatch: ngpus not reported`` and a
    replacement is asked for. With ``unverified_templates = ["gpu"]`` the same kind of machine is supply and stays."""
    seen: dict[str, Any] = {}

    async def verified() -> None:
        env = _without_gpu_runtime(tmp_path / "a")
        # capacity_backoff 1 s: the offer is suspect after a mismatch, and it is the only one.
        options = {"max_machines": 2, "capacity_backoff": 1}
        async with fleet(tmp_path / "a", certs, [unprobed("gpu")], env=env, **options) as rig:
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 1)])
            hosts_seen: dict[str, Any] = {}

            def replaced() -> bool:
                hosts_seen.update(rig.hosts())
                return bool(rig.facts(ReturnIntent)) and len(rig.facts(RequestIntent)) >= 2

            await rig.until(replaced, 90, "the machine returned and a replacement asked for")
            seen["returns"] = [f for _, f in rig.facts(ReturnIntent)]
            seen["hosts"] = hosts_seen

    async def unverified() -> None:
        env = _without_gpu_runtime(tmp_path / "b")
        options = {"unverified_templates": ("gpu",)}
        async with fleet(tmp_path / "b", certs, [unprobed("gpu")], env=env, **options) as rig:
            await rig.ctl.set_demand([DemandItem("gpu", GPU, 1)])
            await rig.until(
                lambda: [h.status.value for h in rig.hosts().values()] == ["idle"], 60, "the machine joined, idle"
            )
            await trio.sleep(5)  # five passes at least: a check would have returned it at the first
            seen["kept"] = list(rig.hosts().values())
            seen["kept_intents"] = len(rig.facts(RequestIntent))
            seen["kept_returns"] = len(rig.facts(ReturnIntent))

    for part in ("a", "b"):
        (tmp_path / part).mkdir()
    trio.run(within, 150, verified)
    trio.run(within, 150, unverified)
    first = seen["returns"][0]
    assert first.reason == "capability_mismatch: ngpus not reported ('1' declared)"
    (host,) = [h for h in seen["hosts"].values() if h.machine_id in first.machine_ids]
    assert set(host.capabilities) == {"ncpus", "mem", "type"}  # the host's own, by default; no GPU measured
    (kept,) = seen["kept"]
    assert "ngpus" not in kept.capabilities and kept.status.value == "idle"
    assert (seen["kept_intents"], seen["kept_returns"]) == (1, 0)
