"""The demo's script (``DemoRun.script``): the whole system on this host, for real, one step at a time, each with its
own timeout (``step_timeouts``):

 1. certificates   a cluster CA and one certificate per role, in a fresh temporary directory
 2. controller     the reference controller with three replicas (a subprocess)
 3. daemon         ``provisionerd run`` on a config for the local provider (machines are agent processes here);
                   it joins the primary and takes the provider's lease
 4. demand         demand for N workers; the daemon commits an intent and asks the local provider for N agents
 5. failover       once half of the workers have joined, the controller's primary is failed over; the daemon
                   rejoins the new primary, resyncs and takes its lease in the new term
 6. rejoin         every worker is joined and idle, its session on the new primary
 7. orphan         one agent is started behind the daemon's back (this cluster's tags, no fact), and
                   ``provisionerd orphans --dry-run`` must report exactly it, as ``tagged_unknown``
 8. drain          demand drops to zero; the daemon returns every worker and the agents exit
 9. stop daemon    SIGTERM: the daemon gives its lease back
10. orphan cleanup ``provisionerd orphans return`` returns the orphan through the lease-gated executor
11. verify         the controller's facts (read afresh) explain every agent: requested = joined = returned = N,
                   and no agent of this cluster is alive without a live fact (``leaked``)

``DemoRun.cleanup`` stops everything of the run; ``provisionerd.demo.run`` calls it whatever happened.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from provisionerd.config.loader import Config
from provisionerd.demo import cluster as dc
from provisionerd.demo.cluster import DemoError, DemoPaths
from provisionerd.demo.observe import Observer, Snapshot
from provisionerd.demo.procs import Child, cluster_agents, tail, wait_gone
from provisionerd.demo.progress import Progress, plain_line
from provisionerd.pki.certs import init_certs
from provisionerd.planner.fact_view import MachineState


def step_timeouts(workers: int) -> dict[str, float]:
    """Seconds each step may take (generous: a loaded 2-core machine starts Python processes slowly)."""
    return {
        "certificates": 30,
        "controller": 30,
        "daemon": 30,
        "demand": 30,
        "failover": 30 + workers,
        "rejoin": 40 + 2 * workers,
        "orphan": 60,
        "drain": 40 + 2 * workers,
        "stop daemon": 20,
        "orphan cleanup": 45,
        "verify": 30,
    }


class DemoRun:
    def __init__(self, workers: int, progress: Progress, root: Path) -> None:
        self.workers = workers
        self.progress = progress
        self.paths = DemoPaths(root)
        self.cluster = f"demo-{secrets.token_hex(3)}"
        self.observer = Observer(self.paths.events, self.cluster, dc.PROVIDER, progress)
        self.timeouts = step_timeouts(workers)
        self.step = ""
        self.steps: list[tuple[str, float]] = []
        self.controller: Child | None = None
        self.daemon: Child | None = None
        self.admin: Any = None
        self.addresses: tuple[str, ...] = ()
        self.config: Config | None = None
        self.orphan: str | None = None
        self._orphan_socket: Any = None
        self.failovers = 0
        self.orphans_reported = 0
        self.counts = {"requested": 0, "joined": 0, "returned": 0}
        self.verified = False  # counts come from the facts (else from the live view)
        self.leaked: int | None = None

    # --- the script ---------------------------------------------------------------------------------------------

    async def script(self) -> None:
        steps: list[tuple[str, str, Callable[[], Awaitable[None]]]] = [
            ("certificates", "creating a cluster CA and certificates", self._certificates),
            ("controller", "starting the reference controller (3 replicas)", self._controller),
            ("daemon", "starting the daemon with the local provider", self._daemon),
            ("demand", f"pushing demand for {self.workers} workers", self._demand),
            ("failover", "failing over the controller primary while the workers join", self._failover),
            ("rejoin", "waiting for every worker to be joined and idle on the new primary", self._rejoin),
            ("orphan", "starting an agent behind the daemon's back; orphan dry-run report", self._orphan),
            ("drain", "dropping demand to zero; every worker is returned", self._drain),
            ("stop daemon", "stopping the daemon (it gives its lease back)", self._stop_daemon),
            ("orphan cleanup", "returning the orphan (provisionerd orphans return)", self._orphan_cleanup),
            ("verify", "checking the controller's facts against the processes", self._verify),
        ]
        for number, (name, title, body) in enumerate(steps, 1):
            self.step = name
            self.observer.set_step(f"step {number}/{len(steps)}: {title}")
            self.progress.say(f"==> [{number}/{len(steps)}] {title}")
            started = trio.current_time()
            timeout = self.timeouts[name]
            try:
                with trio.fail_after(timeout):
                    await body()
            except trio.TooSlowError:
                raise DemoError(
                    name, f"timed out after {timeout:g}s; last status: {plain_line(self.observer.snapshot).strip()}"
                ) from None
            self.steps.append((name, round(trio.current_time() - started, 2)))

    async def _certificates(self) -> None:
        written = await trio.to_thread.run_sync(init_certs, self.paths.certs, self.cluster)
        self.progress.say(f"    cluster {self.cluster!r}: {len(written)} files in {self.paths.certs}")

    async def _controller(self) -> None:
        self.controller, self.addresses = await dc.start_controller(self.paths)
        self.admin = dc.open_admin(self.paths, self.addresses)
        self.observer.watch_controller(self.admin)
        self.progress.say(f"    replicas {', '.join(self.addresses)} (log: {self.controller.log})")
        self.progress.say(f"    store: {dc.DEMO_STORE}")

    async def _daemon(self) -> None:
        if len(str(self.paths.admin_socket).encode()) > 100:  # sockaddr_un holds 108 bytes
            raise DemoError(
                "daemon",
                f"{self.paths.admin_socket} is too long for a Unix socket path: set TMPDIR to a shorter directory",
            )
        if not (dc.LOCAL_PROVIDER / "provider").is_file():
            raise DemoError(
                "daemon",
                f"the local provider is not at {dc.LOCAL_PROVIDER}: the provisionerd install is incomplete "
                f"(reinstall the wheel, or pip install -e . in a checkout)",
            )
        dc.write_local_conf(self.paths, self.workers)
        self.config = dc.write_config(self.paths, self.cluster, self.addresses, self.workers)
        self.daemon = await dc.start_daemon(self.paths)
        self.observer.watch_daemon(self.paths.admin_socket)
        s = await self._wait(lambda s: s.link == "up" and s.lease == "held" and s.epoch is not None)
        self.progress.say(f"    joined the primary {s.daemon_primary}; lease on {dc.PROVIDER!r} held, epoch {s.epoch}")

    async def _demand(self) -> None:
        seq = await self.admin.set_demand(dc.demand(self.workers))
        s = await self._wait(lambda s: s.requested >= self.workers)
        self.progress.say(
            f"    demand snapshot seq {seq}; intent committed, {s.requested} agents asked of the "
            f"local provider (each with its own single-use join token)"
        )

    async def _failover(self) -> None:
        half = (self.workers + 1) // 2
        before = await self._wait(lambda s: s.joined >= half and s.primary is not None)
        result = await self.admin.fail_over()
        self.failovers += 1
        new, term = int(result["primary"]), int(result["term"])
        self.progress.say(
            f"    {before.joined}/{self.workers} joined: primary #{before.primary} -> #{new}, term {term}"
        )
        address = self.addresses[new]
        s = await self._wait(
            lambda s: (
                s.link == "up"
                and s.daemon_primary == address
                and s.lease == "held"
                and (s.epoch or "").startswith(f"{term}.")
            )
        )
        self.progress.say(f"    the daemon rejoined #{new} ({address}), resynced, lease epoch {s.epoch}")

    async def _rejoin(self) -> None:
        n = self.workers
        s = await self._wait(lambda s: s.joined >= n and s.idle >= n and s.workers_on_primary >= n)
        self.progress.say(
            f"    {s.joined} workers joined, {s.idle} idle, {s.workers_on_primary} sessions on primary #{s.primary}"
        )

    async def _orphan(self) -> None:
        assert self.config is not None
        self._orphan_socket, nowhere = dc.unreachable_address()
        self.orphan = machine = await dc.start_orphan(self.paths, self.config, nowhere)
        self.progress.say(f"    agent {machine} started with this cluster's tags and no fact behind it")
        done = await dc.run_cli(
            self.paths,
            ["orphans", "--config", str(self.paths.config), "--dry-run", "--json", "--timeout", "20"],
            self.timeouts["orphan"] - 5,
        )
        try:
            report = json.loads(done.stdout)
            findings = list(report["findings"])
        except (ValueError, KeyError, TypeError):
            raise DemoError(
                "orphan",
                f"provisionerd orphans --dry-run exited {done.returncode} without a "
                f"report: {done.stdout[:300]!r} (see {self.paths.logs / 'cli.log'})",
            ) from None
        for finding in findings:
            self.progress.say(
                f"    report: {finding.get('class')} {finding.get('machine_id')}  would "
                f"{finding.get('action')}, blocked by {', '.join(finding.get('blocked_by', []))}"
            )
        self.orphans_reported = len(findings)
        ours = [f for f in findings if f.get("machine_id") == machine and f.get("class") == "tagged_unknown"]
        if done.returncode != 0 or report.get("mutations") != 0:
            raise DemoError("orphan", f"the dry run exited {done.returncode} with {report.get('mutations')} mutations")
        if not ours or len(findings) != 1:
            raise DemoError(
                "orphan",
                f"expected exactly the orphan {machine} as tagged_unknown, got "
                f"{[(f.get('class'), f.get('machine_id')) for f in findings]}",
            )

    async def _drain(self) -> None:
        seq = await self.admin.set_demand(dc.demand(0))
        n, orphan = self.workers, {self.orphan}
        # Returned, their agents exited (the orphan's is the one left) and the controller saw them go.
        s = await self._wait(lambda s: s.returned >= n and not s.agent_ids - orphan and s.live_hosts == 0)
        self.progress.say(
            f"    demand snapshot seq {seq}: {s.returned} workers returned, their agents exited, "
            f"the controller has no live worker left"
        )

    async def _stop_daemon(self) -> None:
        assert self.daemon is not None
        code = await self.daemon.stop(grace=15)
        self.observer.daemon_stopped()
        if code != 0:
            raise DemoError("stop daemon", f"the daemon exited with {code} (log: {self.daemon.log})")
        released = [e for e in self.observer.releases if e.get("provider") == dc.PROVIDER]
        if not released or released[-1].get("confirmed") is not True:
            raise DemoError("stop daemon", f"the daemon did not give its lease back (events: {self.paths.events})")
        self.progress.say(
            f"    stopped (exit 0); lease epoch {released[-1].get('epoch')} released, the controller confirmed"
        )

    async def _orphan_cleanup(self) -> None:
        assert self.orphan is not None
        args = [
            "orphans",
            "return",
            "--config",
            str(self.paths.config),
            "--provider",
            dc.PROVIDER,
            "--machine",
            self.orphan,
        ]
        done = await dc.run_cli(self.paths, args, self.timeouts["orphan cleanup"] - 10)
        if done.returncode != 0:
            raise DemoError(
                "orphan cleanup",
                f"provisionerd orphans return exited {done.returncode}: {tail(self.paths.logs / 'cli.log', 3)}",
            )
        orphan = self.orphan
        gone = await wait_gone(
            lambda: any(a.machine_id == orphan for a in cluster_agents(self.cluster)), 10, interval=0.2
        )
        if not gone:
            raise DemoError("orphan cleanup", f"the orphan's agent {orphan} is still running after its return")
        self.progress.say(f"    {orphan} returned through the lease-gated executor (admin-confirmed); it exited")

    async def _verify(self) -> None:
        assert self.config is not None
        while True:  # the last Returned fact may trail the agents' exit by one status poll
            facts, hosts = await dc.read_facts(self.config, timeout=10, data=self.paths.controller_data)
            made = [m for m in facts.machines.values() if m.provider == dc.PROVIDER and m.op_id in facts.intents]
            returned = sum(1 for m in made if m.state is MachineState.RETURNED)
            if returned >= len(made):
                break
            await trio.sleep(0.5)
        refs = {m.instance_ref for m in made}
        seen = self.observer.seen_joined | set(hosts)
        self.counts = {
            "requested": sum(r.intent.count for r in facts.intents.values() if r.intent.provider == dc.PROVIDER),
            "joined": len(refs & seen),
            "returned": returned,
        }
        self.verified = True
        alive = cluster_agents(self.cluster)
        live = {m.machine_id for m in facts.machines.values() if m.state.live}
        unexplained = [a for a in alive if a.machine_id not in live]
        self.leaked = len(unexplained)
        c, n = self.counts, self.workers
        self.progress.say(
            f"    facts: {c['requested']} requested, {len(made)} made, {c['joined']} joined, "
            f"{c['returned']} returned; agents alive: {len(alive)}, unexplained: "
            f"{self.leaked}"
        )
        wrong = [f"{k} {v} != {n}" for k, v in c.items() if v != n]
        if self.leaked:
            wrong.append(f"{self.leaked} agent(s) alive that no fact explains: {[a.machine_id for a in unexplained]}")
        if wrong:
            raise DemoError("verify", "; ".join(wrong))

    async def _wait(self, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        return await self.observer.wait_for(predicate, self._check_alive)

    def _check_alive(self) -> None:
        """Fail the step at once when a piece that should run has exited (with the end of its log)."""
        for child in (self.controller, self.daemon):
            if child is not None and not child.running():
                raise DemoError(
                    self.step,
                    f"the {child.name} exited with {child.process.returncode}; the end of "
                    f"its log ({child.log}):\n{tail(child.log)}",
                )

    # --- clean-up -----------------------------------------------------------------------------------------------

    async def cleanup(self, keep: bool) -> list[str]:
        """Stop everything of this run and remove its directory (unless ``keep``); returns what it had to force."""
        self.observer.stop_watching()
        if self._orphan_socket is not None:
            self._orphan_socket.close()
        notes, left = await dc.stop_everything(self.paths, self.cluster, self.daemon, self.controller, keep=keep)
        if self.leaked is None:  # the run did not get to verify: whatever survived the clean-up leaked
            self.leaked = left
        return notes
