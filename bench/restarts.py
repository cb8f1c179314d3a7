"""A real-process restart campaign: changing demand, random restarts, every machine checked against the facts
(issue 31, item 8).

Run from the repository root inside the project's environment::

    python bench/restarts.py [--minutes 30] [--provider local|legacy] [--seed N] [--restart-every S]

What runs, all on loopback, each its own process (started through the test rig, ``tests/rigs``, so everything is
stopped at the end however the run ends):

- the reference controller, ``python -m refcontroller serve`` on a SQLite store (``rigs.controller.ServedController``:
  restarted on the same store and the same address; lease TTL 6 s, checks every 0.5 s, 5 s heartbeat timeout);
- the daemon, ``python -m provisionerd run`` (``rigs.daemon``: test timings, a ``state_dir``), one provider with
  ``join_deadline`` 60 s, ``rejoin_settle`` 15 s, ``idle_time`` 5 s:

  - ``local`` (default): the shipped local provider over its persistent transport; each machine is a real
    ``provisionerd agent`` process that joins the controller with its own token. Its machines are the live agents
    its listing finds (``localprovider.procs.scan_agents``, the ``/proc`` scan ``listMachines`` makes), what it
    ever made is its records (``machines/*.json``, with the op tag);
  - ``legacy``: the shipped LSF example (``providers/examples/lsf_legacy``, legacy mode, a journal) whose
    ``requestMachines`` makes its machines and then sleeps ``--slow-request`` seconds (1.5) before it answers.
    Its machines are the records of its state file that are not ``terminated`` (as ``world.plugin_machines`` in
    tests/legacy reads them). The bench plays the machine image: for each machine the plugin reports running it
    boots ``provisionerd agent --address-bound --machine-id ID`` (the controller runs with ``--address-bound-join``;
    the plugin gives every machine 127.0.0.1), and stops that agent when the plugin terminates the machine.

Demand is one item (1 CPU for local, 2 for legacy) whose count changes at random (seeded) between 0 and
``--max-demand`` (4) every 8-20 s. Every ``--restart-every`` seconds on average (30: 20-40 s, drawn from the seed;
measured from one restart to the next, and never sooner than 2 s after the previous one converged or timed out)
one restart, of a kind drawn with weights:

- ``controller_kill9`` / ``controller_term``: the controller SIGKILLed or SIGTERMed, started again on its store;
- ``daemon_kill9`` / ``daemon_term``: the daemon SIGKILLed or SIGTERMed (its whole process group), started again
  0.3 s after it is gone;
- ``plugin_kill9``: demand raised by 1-2 first, then 0.2-1.2 s later the plugin process SIGKILLed: for legacy the
  running ``requestMachines`` call's process group (it runs in its own session), for local the persistent plugin
  process (the daemon starts another). Skipped (another kind drawn) when demand is at its maximum or no such
  process shows up within 8 s;
- ``agent_kill9``: one machine's agent SIGKILLed. Local: the machine was that process, so it is expected to be
  returned or lost, and counted in ``agent_killed_returned``, never as healthy. Legacy: the machine image runs the
  agent as a service its init system restarts (1 s later, the same command line, ``--state-file``): the machine must
  rejoin and stay, so a return of it counts as a healthy machine returned (``agents_restarted`` counts them).

Half of the controller and daemon restarts come 0-2.5 s after a demand change, so calls are in flight.

After each restart the demand is held and the bench polls every 0.5 s until the run has **converged**: the
provider's live machines are exactly the machines with a live fact in the controller's store (an
``InstanceFact`` or ``OrphanAdopted`` not ended by ``Returned`` or ``Lost``, read read-only from the SQLite file as
``rigs.facts`` reads it), their number equals the demand, and each has a host in the controller's host table that
is not ``lost`` (``refcontroller`` admin ``status``), and no machine whose agent was killed still runs (a machine
already counted as unexplained, below, is left out). The time from the restart to that is the restart's converge
time; no convergence within ``--converge-limit`` (240 s) is a violation naming what was still off. At the end the
demand is set to 0 and the same check waits up to ``--settle`` (240 s) for no machine and no live fact.

The last line is JSON:

- ``restarts``: ``total`` and ``by_kind``; ``skipped``: draws that found nothing to kill;
- ``leaked``: machines the provider still runs at the end, after the settle period, with no live fact (``leaked_ids``
  names them); ``left_running``: every machine still running then, fact or not; ``live_facts_left``;
- ``duplicates``: machines made beyond what the ops asked. Local: per op tag, machines its records name beyond the
  op's ``RequestIntent.count`` (a record whose op has no intent counts whole). Legacy (the plugin knows no op
  tags): machines its state file says it ever made beyond the sum of every ``RequestIntent.count``;
- ``healthy_returned``: machines the daemon planned to return (events log: ``action`` events, phase ``planned``,
  kind ``return``) or to mark lost (kind ``lost``) for a reason other than demand (``idle``, ``released``,
  ``drained``), whose agent the bench did not kill; ``healthy_returned_detail`` gives each with its reason and
  time; ``agent_killed_returned``: the same for machines whose agent was killed (expected, not a leak);
  ``returns_by_reason``: every planned return by reason;
- ``longest_converge_s`` and ``converge_s`` (each restart's, with its kind and time), ``not_converged``;
- ``unexplained_seen``: machines seen running with no live fact for ``--unexplained-after`` seconds (60) on end, or
  when a restart's check timed out; each is one violation, is left out of later convergence checks, and counts as
  ``leaked`` if it still runs at the end;
- ``violations``: short strings, one per problem (a non-converged restart, a leak, a duplicate, a healthy machine
  returned, an unexplained machine);
- ``requests`` (planned request actions), ``machines_made``, ``demand_changes``, ``wall_s``, ``dir`` (kept with
  ``--keep``).

``--kinds`` limits the restart kinds drawn (comma-separated); ``--seed`` replays a run's draws (the timing of the
real processes still varies). The run stops by itself: the campaign ends after ``--minutes``, the settle after
``--settle``, and a hard deadline (both plus 180 s) cancels whatever is still waiting; every process it started,
and every agent the local provider started, is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import realprocs  # noqa: F401  (puts tests/ on sys.path for the rig)
import trio
from rigs import agents, procs
from rigs.controller import ServedController
from rigs.daemon import Daemon, daemon_config, local_provider, make_certs

from provisionerd.config.loader import LegacyOptions, ProviderConfig, ProviderTimeouts
from provisionerd.domain.model import (
    TAG_OP,
    DemandItem,
    InstanceFact,
    Lost,
    OrphanAdopted,
    RequestIntent,
    ResourceShape,
    Returned,
)
from refcontroller.store import FactStore

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "providers" / "local"))
from localprovider.procs import scan_agents  # noqa: E402

EXAMPLE = REPO / "providers" / "examples" / "lsf_legacy"
CLUSTER = "restarts"
DEMAND_ID = "d1"
JOIN_DEADLINE, REJOIN_SETTLE, IDLE_TIME = 60.0, 15.0, 5.0
#: Reasons a machine is returned for because demand no longer needs it.
DEMAND_REASONS = frozenset({"idle", "released", "drained"})
KINDS = {
    "controller_kill9": 15,
    "controller_term": 15,
    "daemon_kill9": 20,
    "daemon_term": 15,
    "plugin_kill9": 15,
    "agent_kill9": 20,
}


# --- what the controller's store says -----------------------------------------------------------------------------


def read_facts(path: Path) -> list[Any] | None:
    """Every fact in the store file, read-only beside the running controller (``None``: not readable now)."""
    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return None
    try:
        return [c.fact for c in FactStore(conn, "").all_facts()]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def live_facts(facts: list[Any]) -> dict[str, str]:
    """machine_id -> instance_ref of every machine whose fact is live (made or adopted, not returned or lost)."""
    live: dict[str, str] = {}
    for fact in facts:
        if isinstance(fact, InstanceFact | OrphanAdopted):
            live[fact.machine_id] = fact.instance_ref
        elif isinstance(fact, Returned):
            for machine_id in fact.machine_ids:
                live.pop(machine_id, None)
        elif isinstance(fact, Lost):
            live.pop(fact.machine_id, None)
    return live


def intents(facts: list[Any]) -> dict[str, int]:
    return {f.op_id: f.count for f in facts if isinstance(f, RequestIntent)}


# --- the providers --------------------------------------------------------------------------------------------------


class Local:
    """The shipped local provider: machines are agent processes the plugin starts."""

    #: A killed agent is a dead machine (nothing restarts it).
    agents_restart = False

    name = "local"
    ncpus = 1

    def __init__(self, root: Path, certs: Path) -> None:
        self.root = root
        self.config = local_provider(
            root, certs, machines=8, join_deadline=JOIN_DEADLINE, rejoin_settle=REJOIN_SETTLE, idle_time=IDLE_TIME
        )
        assert self.config.data_dir is not None
        self.data = Path(self.config.data_dir).resolve()

    def controller_args(self) -> tuple[str, ...]:
        return ()

    def live(self) -> set[str]:
        return set(scan_agents(str(self.data)))

    def agent_pids(self) -> dict[str, int]:
        return {m: a.pid for m, a in scan_agents(str(self.data)).items()}

    def duplicates(self, asked: dict[str, int]) -> tuple[int, int, list[str]]:
        """(machines made, machines beyond their op's ask, notes)."""
        made: dict[str, set[str]] = {}
        for path in (self.data / "machines").glob("*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            made.setdefault(record.get("tags", {}).get(TAG_OP, "?"), set()).add(record["machineId"])
        extra, notes = 0, []
        for op, machines in sorted(made.items()):
            over = len(machines) - asked.get(op, 0)
            if over > 0:
                extra += over
                notes.append(f"op {op}: {len(machines)} machines made, {asked.get(op, 0)} asked")
        return sum(map(len, made.values())), extra, notes

    def plugin_pids(self, daemon: Daemon) -> list[int]:
        """The persistent plugin: the daemon's child process(es)."""
        return children(daemon.proc.pid) if daemon.proc is not None and daemon.proc.running() else []

    async def tend(self, started: procs.Procs, addresses: tuple[str, ...]) -> None:
        """Nothing to do: the plugin starts and stops its agents."""

    def finish(self) -> None:
        agents.kill_left(str(self.root))


class Legacy:
    """The LSF example in legacy mode, slow ``requestMachines``; the bench boots each running machine's agent."""

    name = "lsfex"
    ncpus = 2
    #: The machine image restarts a dead agent (``tend``): a killed agent's machine must stay.
    agents_restart = True

    def __init__(self, root: Path, certs: Path, slow: float) -> None:
        self.root, self.certs = root, certs
        self.conf, self.data = root / "lsfex-conf", root / "lsfex-data"
        self.conf.mkdir()
        self.data.mkdir()
        shutil.copy(EXAMPLE / "conf" / "lsfexampleprov_templates.json", self.conf)
        settings = {"BOOT_POLLS": 1, "PRIVATE_IP": "127.0.0.1", "SLOW_REQUEST_SECONDS": slow}
        (self.conf / "lsfexampleprov_config.json").write_text(
            json.dumps(settings | {"SLOW_REQUEST_PHASE": "after_create"})
        )
        self.secret = secrets.token_urlsafe(24)
        self.bootstrap = agents.token_file(root, self.secret, "bootstrap")
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
        self.config = ProviderConfig(
            "lsfex",
            "oneshot",
            path=EXAMPLE,
            conf_dir=self.conf,
            data_dir=self.data,
            env={"PATH": path},
            timeouts=ProviderTimeouts(default=30.0),
            max_machines=10,
            join_deadline=JOIN_DEADLINE,
            rejoin_settle=REJOIN_SETTLE,
            idle_time=IDLE_TIME,
            legacy=LegacyOptions(journal=root / "lsfex.journal.json", state_file="lsfexample"),
        )
        self.agents: dict[str, procs.Proc] = {}
        self.dead_since: dict[str, float] = {}  # machine id -> when its agent was first seen dead (trio clock)

    def controller_args(self) -> tuple[str, ...]:
        return ("--address-bound-join", str(self.bootstrap))

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.data / "lsfexample-state.json").read_text()))
        except (OSError, ValueError):
            return {"machines": {}, "requests": {}}

    def live(self) -> set[str]:
        return {m for m, r in self.state()["machines"].items() if r["status"] != "terminated"}

    def agent_pids(self) -> dict[str, int]:
        return {m: a.pid for m, a in self.agents.items() if a.running()}

    def duplicates(self, asked: dict[str, int]) -> tuple[int, int, list[str]]:
        made = len(self.state()["machines"])
        over = made - sum(asked.values())
        return made, max(0, over), [f"{made} machines made, {sum(asked.values())} asked"] if over > 0 else []

    def plugin_pids(self, daemon: Daemon) -> list[int]:
        """Running ``requestMachines`` calls of this plugin (each leads its own process group)."""
        found = []
        for pid in pids_with_env("PRO_DATA_DIR", str(self.data)):
            if "requestMachines" in cmdline(pid):
                found.append(pid)
        return found

    async def tend(self, started: procs.Procs, addresses: tuple[str, ...]) -> None:
        """The machine image: an address-bound agent for each running machine, stopped when it is terminated."""
        machines = self.state()["machines"]
        for machine_id, record in sorted(machines.items()):
            agent = self.agents.get(machine_id)
            if record["status"] == "running" and (agent is None or not agent.running()):
                # A first boot, or the init system restarting an agent that died (``Restart=always``, 1 s later):
                # the same command line; a restarted agent reads its state file, the token file being gone.
                home = self.root / "machines" / machine_id
                token = home / "bootstrap"
                if agent is None and not token.exists():
                    agents.token_file(home, self.secret, "bootstrap")
                elif agent is not None:
                    dead_since = self.dead_since.setdefault(machine_id, trio.current_time())
                    if trio.current_time() < dead_since + 1.0:
                        continue
                    del self.dead_since[machine_id]
                how = ("--address-bound", "--machine-id", machine_id, "--state-file", str(home / "state.json"))
                self.agents[machine_id] = await agents.boot(started, home, self.certs, addresses, token, *how)
            elif record["status"] == "terminated" and machine_id in self.agents:
                agent = self.agents[machine_id]
                if agent.running():
                    agent.terminate()

    def finish(self) -> None:
        for agent in self.agents.values():
            agent.kill9()


# --- processes ------------------------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def pids_with_env(key: str, value: str) -> list[int]:
    """This user's processes whose environment has ``key=value``."""
    wanted = f"{key}={value}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if wanted in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                found.append(int(name))
        except OSError:
            continue
    return found


def kill_group(pid: int, spare: tuple[int, ...] = ()) -> bool:
    """SIGKILL ``pid``'s process group, or only ``pid`` when its group is this process's or one of ``spare``'s."""
    try:
        group = os.getpgid(pid)
        if group in {os.getpgid(0), *(os.getpgid(p) for p in spare)}:
            os.kill(pid, signal.SIGKILL)
        else:
            os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def read_events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


# --- the campaign ---------------------------------------------------------------------------------------------------


class Campaign:
    def __init__(self, args: argparse.Namespace, root: Path, started: procs.Procs) -> None:
        self.args = args
        self.root = root
        self.started = started
        self.rng = random.Random(args.seed)
        self.t0 = trio.current_time()
        self.wall0 = time.time()
        certs = make_certs(root, CLUSTER)
        self.provider: Local | Legacy = (
            Local(root, certs) if args.provider == "local" else Legacy(root, certs, args.slow_request)
        )
        self.ctl = ServedController.at_free_ports(
            certs,
            root / "ctl",
            started,
            args=(
                "--lease-ttl",
                "6",
                "--check-interval",
                "0.5",
                "--heartbeat-timeout",
                "5",
                "--log-level",
                "WARNING",
                *self.provider.controller_args(),
            ),
        )
        self.store = root / "ctl" / "facts.sqlite"
        state = root / "state"
        state.mkdir(mode=0o700)
        config = daemon_config(
            certs, self.ctl.addresses, state, self.provider.config, cluster=CLUSTER, identity="prov-restarts",
            state_dir=state,
        )  # fmt: skip
        self.daemon = Daemon.write(config, root / "pd.toml", started)
        self.demand = 0
        self.demand_changes = 0
        self.restarts: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.converge: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.killed_agents: dict[str, float] = {}  # machine id -> when its agent was killed (for good)
        self.restarted_agents: dict[str, float] = {}  # machine id -> when its agent was killed and restarted
        self.unexplained: set[str] = set()
        self.no_fact_since: dict[str, float] = {}

    def now(self) -> float:
        return round(trio.current_time() - self.t0, 1)

    # demand and observation

    async def set_demand(self, count: int) -> None:
        items = [DemandItem(DEMAND_ID, ResourceShape(ncpus=self.provider.ncpus), count)] if count else []
        for _ in range(60):
            try:
                await self.ctl.admin.set_demand(items)
            except Exception:  # the controller restarting: try again
                await trio.sleep(0.5)
                continue
            if count != self.demand:
                self.demand_changes += 1
            self.demand = count
            return
        self.violations.append(f"t={self.now()} demand {count} could not be set for 30 s")

    async def hosts_up(self) -> set[str] | None:
        """Instance refs of the controller's hosts that are not lost (``None``: no answer)."""
        try:
            status = await self.ctl.admin.status()
        except Exception:
            return None
        return {h["instance_ref"] for h in status.get("hosts", []) if h.get("status") != "lost"}

    async def snapshot(self) -> dict[str, Any]:
        live = self.provider.live()
        facts = read_facts(self.store)
        hosts = await self.hosts_up()
        return {"live": live, "facts": None if facts is None else live_facts(facts), "hosts": hosts}

    def converged(self, snap: dict[str, Any], demand: int) -> bool:
        facts, hosts = snap["facts"], snap["hosts"]
        if facts is None or hosts is None:
            return False
        if snap["live"] & set(self.killed_agents):  # a machine whose agent was killed must go first
            return False
        live = snap["live"] - self.unexplained  # counted once already (a violation), and as leaked if it stays
        return len(live) == demand and live == set(facts) and set(facts.values()) <= hosts

    def describe(self, snap: dict[str, Any], demand: int) -> str:
        facts, hosts = snap["facts"] or {}, snap["hosts"]
        parts = [f"demand {demand}, {len(snap['live'])} running"]
        if no_fact := sorted(snap["live"] - set(facts)):
            parts.append(f"running with no fact {no_fact}")
        if gone := sorted(set(facts) - snap["live"]):
            parts.append(f"fact but not running {gone}")
        if dead := sorted(snap["live"] & set(self.killed_agents)):
            parts.append(f"running with its agent killed {dead}")
        if hosts is None:
            parts.append("controller not answering")
        elif unjoined := sorted(m for m, ref in facts.items() if ref not in hosts):
            parts.append(f"no host {unjoined}")
        return "; ".join(parts)

    async def watch(self) -> None:
        """A daemon or controller that exited on its own is a violation; it is started again."""
        for name, proc, start in (
            ("daemon", self.daemon.proc, self.daemon.start),
            ("controller", self.ctl.proc, self.ctl.start),
        ):
            if proc is not None and not proc.running():
                self.violations.append(
                    f"t={self.now()} the {name} exited on its own ({proc.returncode}): {proc.tail(3)}"[:400]
                )
                await start()

    async def wait_converged(self, limit: float, what: str) -> tuple[float | None, dict[str, Any]]:
        begun = trio.current_time()
        demand = self.demand
        snap: dict[str, Any] = {}
        while trio.current_time() - begun < limit:
            await self.watch()
            await self.provider.tend(self.started, self.ctl.addresses)
            snap = await self.snapshot()
            self.track(snap["live"], snap["facts"])
            if self.converged(snap, demand):
                return trio.current_time() - begun, snap
            await trio.sleep(0.5)
        self.violations.append(f"t={self.now()} no convergence {limit:g} s after {what}: {self.describe(snap, demand)}")
        return None, snap

    def track(self, live: set[str], facts: dict[str, str] | None) -> None:
        """A machine running with no live fact for ``--unexplained-after`` seconds is unexplained (a violation,
        once): from then on the convergence checks leave it out, and the end counts it as leaked if it stays."""
        if facts is None:
            return
        now = trio.current_time()
        for machine_id in list(self.no_fact_since):
            if machine_id not in live or machine_id in facts:
                del self.no_fact_since[machine_id]
        for machine_id in sorted(live - set(facts) - self.unexplained):
            since = self.no_fact_since.setdefault(machine_id, now)
            if now - since >= self.args.unexplained_after:
                self.unexplained.add(machine_id)
                self.violations.append(
                    f"t={self.now()} {machine_id} running with no fact for {self.args.unexplained_after:g} s"
                )

    def note_unexplained(self, snap: dict[str, Any], what: str) -> None:
        if snap.get("facts") is None:
            return
        for machine_id in sorted(snap["live"] - set(snap["facts"])):
            if machine_id not in self.unexplained:
                self.unexplained.add(machine_id)
                self.violations.append(f"t={self.now()} {machine_id} running with no fact after {what}")

    # restarts

    async def demand_then_wait(self, low: float, high: float, step: int | None = None) -> None:
        if step is None:
            await self.set_demand(self.rng.choice([n for n in range(self.args.max_demand + 1) if n != self.demand]))
        else:
            await self.set_demand(min(self.args.max_demand, self.demand + step))
        await trio.sleep(self.rng.uniform(low, high))

    async def restart(self, kind: str) -> bool:
        """Do one restart of ``kind``; False when there was nothing to restart."""
        if kind.startswith(("controller", "daemon")) and self.rng.random() < 0.5:
            await self.demand_then_wait(0.0, 2.5)
        if kind.startswith("controller"):
            await self.ctl.restart(kill=kind.endswith("kill9"))
        elif kind.startswith("daemon"):
            proc = self.daemon.proc
            assert proc is not None
            if kind.endswith("kill9"):
                proc.kill9()
                await proc.wait()
            else:
                proc.terminate()
                await procs.reap(proc, 30.0)
            await trio.sleep(0.3)
            await self.daemon.start()
        elif kind == "plugin_kill9":
            if self.demand >= self.args.max_demand:
                return False
            await self.demand_then_wait(0.2, 1.2, step=self.rng.choice([1, 2]))
            for _ in range(80):  # 8 s for the call to show up
                if pids := self.provider.plugin_pids(self.daemon):
                    break
                await trio.sleep(0.1)
            daemon = self.daemon.proc
            if not pids or not kill_group(pids[0], spare=(daemon.pid,) if daemon and daemon.running() else ()):
                return False
        elif kind == "agent_kill9":
            running = self.provider.agent_pids()
            if not running:
                return False
            machine_id = self.rng.choice(sorted(running))
            kill_group(running[machine_id])
            if self.provider.agents_restart:
                self.restarted_agents[machine_id] = self.now()
            else:
                self.killed_agents[machine_id] = self.now()
        return True

    async def run(self) -> None:
        await self.ctl.start()
        await self.daemon.start()
        await self.daemon.wait_held(120)
        end = self.t0 + 60 * self.args.minutes
        mean = self.args.restart_every
        next_restart = trio.current_time() + self.rng.uniform(2 * mean / 3, 4 * mean / 3)
        next_demand = trio.current_time() + self.rng.uniform(2.0, 8.0)
        while trio.current_time() < end:
            await self.watch()
            await self.provider.tend(self.started, self.ctl.addresses)
            facts = read_facts(self.store)
            self.track(self.provider.live(), None if facts is None else live_facts(facts))
            now = trio.current_time()
            if now >= next_demand:
                await self.demand_then_wait(0.0, 0.0)
                next_demand = now + self.rng.uniform(8.0, 20.0)
            if now >= next_restart:
                kinds = {k: w for k, w in KINDS.items() if k in self.args.kinds}
                while kinds:
                    kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
                    at = self.now()
                    if await self.restart(kind):
                        break
                    self.skipped[kind] = self.skipped.get(kind, 0) + 1
                    del kinds[kind]
                self.restarts[kind] = self.restarts.get(kind, 0) + 1
                took, snap = await self.wait_converged(self.args.converge_limit, f"{kind} at t={at}")
                self.note_unexplained(snap, f"{kind} at t={at}")
                self.converge.append({"kind": kind, "at": at, "demand": self.demand, "s": took and round(took, 1)})
                now = trio.current_time()
                next_restart = now + max(2.0, self.rng.uniform(2 * mean / 3, 4 * mean / 3) - (now - self.t0 - at))
                next_demand = max(next_demand, now + self.rng.uniform(2.0, 8.0))
            await trio.sleep(0.5)

    async def settle(self) -> dict[str, Any]:
        await self.set_demand(0)
        took, snap = await self.wait_converged(self.args.settle, "demand 0 at the end")
        self.note_unexplained(snap, "the settle period")
        return {"settle_s": took and round(took, 1), "end": snap}

    def report(self, end: dict[str, Any] | None) -> dict[str, Any]:
        facts = read_facts(self.store) or []
        asked = intents(facts)
        made, duplicates, dup_notes = self.provider.duplicates(asked)
        self.violations += [f"duplicate: {note}" for note in dup_notes]
        events = read_events(self.daemon.events_path)
        planned = [e for e in events if e.get("event") == "action" and e.get("phase") == "planned"]
        by_reason: dict[str, int] = {}
        healthy, killed = [], []
        for event in planned:
            if event.get("kind") not in ("return", "lost"):
                continue
            reason = str(event.get("reason"))
            machines = event.get("machines") or [event.get("machine")]
            by_reason[reason] = by_reason.get(reason, 0) + len(machines)
            if reason in DEMAND_REASONS:
                continue
            for machine_id in machines:
                entry = {"machine": machine_id, "kind": event["kind"], "reason": reason, "op": event.get("op_id"),
                         "t": round(float(event.get("ts", 0.0)) - self.wall0, 1)}  # fmt: skip
                (killed if machine_id in self.killed_agents else healthy).append(entry)
        for entry in healthy:
            self.violations.append(f"healthy machine {entry['machine']} {entry['kind']} as {entry['reason']}")
        snap = (end or {}).get("end") or {"live": self.provider.live(), "facts": live_facts(facts)}
        live, live_f = snap.get("live", set()), snap.get("facts") or {}
        leaked = sorted(live - set(live_f))
        self.violations += [f"leaked {m}" for m in leaked]
        times = [c["s"] for c in self.converge if c["s"] is not None]
        return {
            "provider": self.args.provider,
            "minutes": self.args.minutes,
            "seed": self.args.seed,
            "restart_every": self.args.restart_every,
            "restarts": {"total": sum(self.restarts.values()), "by_kind": dict(sorted(self.restarts.items()))},
            "skipped": self.skipped,
            "leaked": len(leaked),
            "leaked_ids": leaked,
            "left_running": len(live),
            "live_facts_left": len(live_f),
            "duplicates": duplicates,
            "healthy_returned": len(healthy),
            "healthy_returned_detail": healthy[:20],
            "agent_killed_returned": len(killed),
            "agents_killed": len(self.killed_agents),
            "agents_restarted": len(self.restarted_agents),
            "returns_by_reason": dict(sorted(by_reason.items())),
            "longest_converge_s": max(times) if times else None,
            "not_converged": sum(1 for c in self.converge if c["s"] is None),
            "converge_s": [[c["kind"], c["at"], c["demand"], c["s"]] for c in self.converge],
            "unexplained_seen": sorted(self.unexplained),
            "requests": sum(1 for e in planned if e.get("kind") == "request"),
            "machines_made": made,
            "demand_changes": self.demand_changes,
            "settle_s": (end or {}).get("settle_s"),
            "violations": self.violations,
        }


async def campaign(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    hard = 60 * args.minutes + args.settle + 180
    result: dict[str, Any] = {}
    end: dict[str, Any] | None = None
    async with procs.open_procs(grace=15.0) as started:
        run = Campaign(args, root, started)
        try:
            with trio.move_on_after(hard) as deadline:
                try:
                    await run.run()
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(args.settle + 60):
                        end = await run.settle()
            if deadline.cancelled_caught:
                run.violations.append(f"hard deadline of {hard:g} s reached")
        except Exception as exc:  # report what was seen so far, with the failure
            run.violations.append(f"bench error: {type(exc).__name__}: {exc}"[:300])
        finally:
            result = run.report(end)
            run.provider.finish()
    return result


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    """A short path under /tmp (the admin socket's path must stay short), removed unless ``keep``."""
    path = Path(tempfile.mkdtemp(prefix="pvd-rst-", dir="/tmp"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--provider", choices=["local", "legacy"], default="local")
    parser.add_argument("--seed", type=int, default=None, help="default: drawn, and printed in the result")
    parser.add_argument("--restart-every", type=float, default=30.0, help="mean seconds between restarts (30)")
    parser.add_argument("--max-demand", type=int, default=4)
    parser.add_argument("--slow-request", type=float, default=1.5, help="legacy: requestMachines answers this late")
    parser.add_argument("--converge-limit", type=float, default=240.0)
    parser.add_argument(
        "--unexplained-after", type=float, default=60.0, help="a machine running this long with no fact is unexplained"
    )
    parser.add_argument("--settle", type=float, default=240.0, help="at the end, after demand 0, at most this long")
    parser.add_argument(
        "--kinds", type=lambda text: set(text.split(",")), default=set(KINDS), help="restart kinds drawn (all)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, store, events)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    started = time.monotonic()
    with workdir(args.keep) as root:
        result = trio.run(campaign, args, root)
    result["wall_s"] = round(time.monotonic() - started, 1)
    if args.keep:
        result["dir"] = str(root)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    raise SystemExit(main())
