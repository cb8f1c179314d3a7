"""What the demo shows and waits for: a ``Snapshot`` of the whole system, refreshed a few times a second.

Sources, each read the way an operator would:

- the reference controller's admin status (primary, term, worker hosts and which replica each worker's session is
  on);
- the daemon's admin socket (``provisionerd status``: its link, the primary it follows, its lease epoch);
- the daemon's JSON events log (what it asked the provider for and what came back), folded by ``EventTally``;
- ``/proc`` (which agents of this cluster are alive).

A source that does not answer keeps its last values, and the reason is kept in ``Snapshot.problem``; the steps'
own timeouts decide when waiting is over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from provisionerd.demo.procs import cluster_agents
from provisionerd.domain.errors import ProvisionerdError

POLL_INTERVAL = 0.25
LIVE_HOST = ("joined", "idle", "busy")


@attrs.frozen
class Snapshot:
    elapsed: float = 0.0
    step: str = ""
    requested: int = 0  # machines the daemon asked the provider for (one count per op_id)
    joined: int = 0  # worker hosts ever seen joined at the controller
    idle: int = 0
    busy: int = 0
    live_hosts: int = 0  # worker hosts the controller counts as joined, idle or busy now
    returning: int = 0  # machines whose return was called and has not come back
    returned: int = 0
    agents: int = 0  # live agent processes carrying this cluster's tag (the orphan included)
    agent_ids: frozenset[str] = frozenset()  # their machine ids
    epoch: str | None = None  # the daemon's lease epoch for the provider
    lease: str = "-"  # the daemon's lease state
    link: str = "-"  # the daemon's controller link state
    daemon_primary: str | None = None  # the controller address the daemon is joined to
    primary: int | None = None  # the controller's primary replica
    primary_address: str | None = None
    term: int | None = None
    workers_on_primary: int = 0  # worker sessions on the primary replica
    problem: str = ""


@attrs.define
class EventTally:
    """Folds the daemon's events (``action`` called/result for requests and returns) into counts.

    An op_id may be called more than once (a retry after an unknown outcome reuses it): each op counts once."""

    requested: dict[str, int] = attrs.field(factory=dict)  # request op_id -> machine count
    return_ops: dict[str, int] = attrs.field(factory=dict)  # return op_id -> machines in the call
    returned_ops: dict[str, int] = attrs.field(factory=dict)  # return op_id -> machines confirmed returned

    def fold(self, event: dict[str, Any]) -> None:
        if event.get("event") != "action" or not isinstance(event.get("op_id"), str):
            return
        op_id, kind, phase = event["op_id"], event.get("kind"), event.get("phase")
        if kind == "request" and phase == "called" and isinstance(event.get("count"), int):
            self.requested[op_id] = event["count"]
        elif kind == "return" and phase == "called" and isinstance(event.get("machines"), int):
            self.return_ops[op_id] = event["machines"]
        elif kind == "return" and phase == "result" and event.get("status") in ("returned", "partial"):
            machines = event.get("machines")
            if isinstance(machines, int):
                self.returned_ops[op_id] = max(self.returned_ops.get(op_id, 0), machines)

    @property
    def total_requested(self) -> int:
        return sum(self.requested.values())

    @property
    def total_returned(self) -> int:
        return sum(self.returned_ops.values())

    @property
    def total_returning(self) -> int:
        return sum(max(0, n - self.returned_ops.get(op, 0)) for op, n in self.return_ops.items())


class EventsTail:
    """Reads the lines appended to a JSON-lines file since the last read (a partial last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(1 << 20)
        except OSError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


def controller_fields(status: dict[str, Any], seen: set[str]) -> dict[str, Any]:
    """The snapshot's controller part from ``refcontroller admin status``; adds joined workers to ``seen``."""
    hosts = [h for h in status.get("hosts", []) if isinstance(h, dict)]
    for host in hosts:
        if host.get("status") in LIVE_HOST and isinstance(host.get("instance_ref"), str):
            seen.add(host["instance_ref"])
    primary = status.get("primary")
    replicas = {r.get("index"): r.get("address") for r in status.get("replicas", []) if isinstance(r, dict)}
    sessions = [s for s in status.get("sessions", []) if isinstance(s, dict)]
    return {
        "idle": sum(1 for h in hosts if h.get("status") == "idle"),
        "busy": sum(1 for h in hosts if h.get("status") == "busy"),
        "live_hosts": sum(1 for h in hosts if h.get("status") in LIVE_HOST),
        "primary": primary if isinstance(primary, int) else None,
        "primary_address": replicas.get(primary),
        "term": status.get("term") if isinstance(status.get("term"), int) else None,
        "workers_on_primary": sum(1 for s in sessions if s.get("role") == "worker" and s.get("replica") == primary),
    }


def daemon_fields(status: dict[str, Any], provider: str) -> dict[str, Any]:
    """The snapshot's daemon part from its status document."""
    link = status.get("link")
    link = link if isinstance(link, dict) else {}
    lease = next((x for x in status.get("leases", []) if isinstance(x, dict) and x.get("provider") == provider), {})
    return {
        "link": str(link.get("state", "-")),
        "daemon_primary": link.get("primary") or None,
        "lease": str(lease.get("state", "-")),
        "epoch": lease.get("epoch") or None,
    }


async def daemon_status(socket: Path) -> dict[str, Any] | None:
    """The running daemon's status document (``provisionerd status``), or ``None`` when it does not answer."""
    from provisionerd.daemon.admin_socket import query

    try:
        reply = await trio.to_thread.run_sync(query, socket, "status", 2.0)
    except (OSError, ValueError):
        return None
    status = reply.get("status") if reply.get("ok") else None
    return status if isinstance(status, dict) else None


class SnapshotView(Protocol):
    """Where each new snapshot is shown (``demo.progress.Progress``): given to the ``Observer`` at construction."""

    def update(self, snapshot: Snapshot) -> None: ...


class Observer:
    """Polls every source every ``POLL_INTERVAL`` seconds; ``wait_for`` returns once a predicate holds.

    What it polls is its own state, told by the script through ``watch_controller(admin)`` (the controller's admin
    API) and ``watch_daemon(socket)`` (the daemon's admin socket, asked for ``status``) once those pieces run, and
    ``stop_watching()``; until then their part of the snapshot stays empty. Each snapshot is shown on ``view``."""

    def __init__(self, events_path: Path, cluster: str, provider: str, view: SnapshotView | None = None) -> None:
        self.cluster = cluster
        self.provider = provider
        self._admin: Any = None
        self._daemon_socket: Path | None = None
        self.snapshot = Snapshot()
        self.tally = EventTally()
        self.seen_joined: set[str] = set()
        self._events = EventsTail(events_path)
        self._view = view
        self._changed = trio.Event()
        self._started = trio.current_time()
        self._fields: dict[str, Any] = {}
        self._events_open = True
        self.releases: list[dict[str, Any]] = []  # the daemon's lease_released events

    def watch_controller(self, admin: Any) -> None:
        """Poll the controller's admin API (``admin.status()``) from now on."""
        self._admin = admin

    def watch_daemon(self, socket: Path) -> None:
        """Poll the daemon's ``status`` on its admin socket from now on."""
        self._daemon_socket = socket

    def stop_watching(self) -> None:
        """Poll neither the controller nor the daemon any more (the run is being cleaned up)."""
        self._admin = self._daemon_socket = None

    def set_step(self, step: str) -> None:
        self._publish(step=step)

    def daemon_stopped(self) -> None:
        """The daemon is gone: stop asking it, show it stopped, and stop folding its events log once its last
        lines are in (other commands append to it from now on)."""
        self._daemon_socket = None
        self._fold_new_events()
        self._events_open = False
        self._fields.update(link="stopped", daemon_primary=None, lease="-", epoch=None)
        self._publish(**self._fields)

    def _fold_new_events(self) -> None:
        for event in self._events.read_new() if self._events_open else ():
            self.tally.fold(event)
            if event.get("event") == "lease_released":
                self.releases.append(event)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.poll()
            await trio.sleep(POLL_INTERVAL)

    async def poll(self) -> None:
        problems = []
        if self._admin is not None:
            try:
                with trio.fail_after(5):
                    status = await self._admin.status()
                self._fields.update(controller_fields(status, self.seen_joined))
            except (ProvisionerdError, OSError, ValueError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                # A failed admin call (a failover in progress, a dead controller) is shown, not fatal: the step
                # waiting on it has its own timeout and names what it waited for.
                problems.append(f"controller status: {type(exc).__name__}: {exc}"[:200])
        if self._daemon_socket is not None:
            status = await daemon_status(self._daemon_socket)
            if status is None:
                problems.append("the daemon's admin socket does not answer")
            else:
                self._fields.update(daemon_fields(status, self.provider))
        self._fold_new_events()
        agents = await trio.to_thread.run_sync(cluster_agents, self.cluster)
        self._publish(
            requested=self.tally.total_requested,
            returned=self.tally.total_returned,
            returning=self.tally.total_returning,
            joined=len(self.seen_joined),
            agents=len(agents),
            agent_ids=frozenset(a.machine_id for a in agents),
            problem="; ".join(problems),
            **self._fields,
        )

    def _publish(self, **changes: Any) -> None:
        self.snapshot = attrs.evolve(self.snapshot, elapsed=trio.current_time() - self._started, **changes)
        if self._view is not None:
            self._view.update(self.snapshot)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(
        self, predicate: Callable[[Snapshot], bool], check: Callable[[], None] = lambda: None
    ) -> Snapshot:
        """Return the first snapshot for which ``predicate`` holds; ``check()`` runs at every change and may raise
        (a piece died). The caller bounds the wait."""
        while True:
            check()
            if predicate(self.snapshot):
                return self.snapshot
            await self._changed.wait()
