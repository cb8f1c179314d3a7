"""The simulated processes: the reference controller's cluster, watched, and a daemon instance built like the real
one (a fresh ``DaemonCore`` per start, so a restart really forgets everything).

``ObservedCluster`` is the reference controller's ``Cluster`` with its three decisions that matter for safety
reported to the recorder as they are made: lease grants (acquire and renew) and fact appends, each with the lease
table's state at that instant.

``DaemonNode`` is one start of a daemon in a *slot* (``"a"``, ``"b"``): same identity across restarts, a new
instance name (``a#1``, ``a#2``...), its own seeded RNG, events that feed the recorder, and a ``CloudClient``. Its
``Join.instance`` is that name (``a-1``: ``#`` is reserved), so every start is a new lease holder for the
controller. A *twin* (slot ``"a.twin"``) is another live daemon configured with slot ``a``'s identity, as the same
config deployed on two hosts would be: the controller must keep the two apart by their instances.
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    LeaseSettings,
    ProviderConfig,
    TlsPaths,
)
from provisionerd.controller.joined_file import JoinedRefs
from provisionerd.controller.lease import LeaseState
from provisionerd.controller.memory_file import InMemory
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import CommittedFact, Epoch, Fact
from provisionerd.provider.client import PluginClient
from provisionerd.provider.runtime import PluginTransport
from provisionerd.provider.runtime import ProviderConfig as RuntimeConfig
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.simulation.cloud import WALL_EPOCH, CloudClient, SimCloud
from provisionerd.testing.simulation.lsf import SimLegacyHost, SimLsfPlugin, SimLsfRunner, legacy_client
from provisionerd.testing.simulation.observe import CallerLease, Commit, Recorder
from refcontroller.cluster import Cluster
from refcontroller.commits import Rejection
from refcontroller.leases import Denied, Granted


@attrs.define(eq=False)
class ObservedCluster(Cluster):
    recorder: Recorder | None = None

    def acquire(self, replica: int, provider: str, holder: str, now: float) -> Granted | Denied | Rejection:
        table, seq = self.leases, self.leases.seq
        result = super().acquire(replica, provider, holder, now)
        if isinstance(result, Granted) and self.recorder is not None:
            fresh = self.leases is not table or self.leases.seq != seq  # a new epoch, not an idempotent re-grant
            self.recorder.grant(provider, holder, result.lease.epoch, renewal=not fresh)
        return result

    def renew(self, replica: int, provider: str, holder: str, epoch: Epoch, now: float) -> Granted | Denied:
        result = super().renew(replica, provider, holder, epoch, now)
        if isinstance(result, Granted) and self.recorder is not None:
            self.recorder.grant(provider, holder, result.lease.epoch, renewal=True)
        return result

    def commit(self, replica: int, fact: Fact, sender: str, now: float, wall: float = 0.0) -> CommittedFact | Rejection:
        lease = self.leases.live(fact.provider, now)
        last = self.store.last_index()
        result = super().commit(replica, fact, sender, now, wall)
        if isinstance(result, CommittedFact) and result.index > last and self.recorder is not None:
            self.recorder.commit(
                Commit(
                    at=now,
                    index=result.index,
                    kind=type(fact).__name__,
                    provider=fact.provider,
                    op_id=fact.op_id,
                    epoch=fact.epoch,
                    sender=sender,
                    lease_epoch=None if lease is None else lease.epoch,
                    lease_holder=None if lease is None else lease.holder,
                    fact=fact,
                )
            )
        return result


class SimEventLog(EventLog):
    """The daemon's events, kept in memory and fed to the recorder (no file, no wall clock in the trace)."""

    def __init__(self, node: DaemonNode) -> None:
        super().__init__(None, keep=2000)
        self._node = node

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": 0.0, "mono": trio.current_time(), "event": event, **fields}
        self.recent.append(record)
        self._node.on_event(event, fields)
        return record


#: A legacy world's share for one daemon start: the plugin, the slot's host, the world's nursery.
LegacyWorld = tuple[SimLsfPlugin, SimLegacyHost, trio.Nursery]


@attrs.frozen
class DaemonSettings:
    """What the world decides for every daemon of a run (drawn from the seed)."""

    cluster: str
    provider: str
    addresses: tuple[str, ...]
    margin: float
    heartbeat_interval: float
    heartbeat_timeout: float
    request_timeout: float
    connect_timeout: float = 2.0
    provider_options: dict[str, Any] = attrs.field(factory=dict)  # ProviderConfig fields (join_deadline...)
    lifecycle: dict[str, Any] = attrs.field(factory=dict)  # DaemonCore keyword arguments (loop_settings...)


def lifecycle_options(settings: DaemonSettings, transport: PluginTransport, rng: random.Random) -> dict[str, Any]:
    """What ``DaemonCore`` needs, when it wires the provisioning lifecycle, to run it in the simulation: the
    simulated cloud instead of plugin processes (``transport``: the cloud's client, or the legacy adapter over the
    simulated LSF plugin), trio's clock as the wall clock. Empty for a core without it."""
    if "providers" not in inspect.signature(DaemonCore).parameters:
        return {}
    return {
        "providers": {settings.provider: PluginClient(transport)},
        "wall": lambda: WALL_EPOCH + trio.current_time(),
        **settings.lifecycle,
    }


class DaemonNode:
    def __init__(
        self,
        slot: str,
        incarnation: int,
        settings: DaemonSettings,
        rng: random.Random,
        recorder: Recorder,
        cloud: SimCloud,
        connect: Any,
        identity: str | None = None,
        memory: InMemory | None = None,
        joined: JoinedRefs | None = None,
        legacy: LegacyWorld | None = None,
    ) -> None:
        """``legacy``: the provider is the simulated LSF plugin behind the production legacy adapter (``lsf``)."""
        self.slot = slot
        self.identity = identity or f"prov-{slot}"
        self.instance = f"{slot}#{incarnation}"
        self.settings = settings
        self.rng = rng
        self.recorder = recorder
        self.tokens: dict[str, list[str]] = {}  # op_id -> join tokens (the daemon's memory only)
        self.scope = trio.CancelScope()
        self.workload: Any = None
        self.events = SimEventLog(self)
        addresses = list(settings.addresses)
        rng.shuffle(addresses)  # daemons are configured in different orders: some start at a standby
        config = Config(
            cluster=settings.cluster,
            identity=self.identity,
            controller=ControllerSettings(
                addresses=tuple(addresses),
                connect_timeout=settings.connect_timeout,
                request_timeout=settings.request_timeout,
                heartbeat_interval=settings.heartbeat_interval,
                heartbeat_timeout=settings.heartbeat_timeout,
                backoff=Backoff(initial=0.2, max=4.0),
            ),
            tls=TlsPaths(Path("/nonexistent/ca.pem"), Path("/nonexistent/cert.pem"), Path("/nonexistent/key.pem")),
            providers=(
                ProviderConfig(
                    name=settings.provider, transport="persistent", argv=("simulated",), **settings.provider_options
                ),
            ),
            lease=LeaseSettings(margin=settings.margin),
        )
        self.client = CloudClient(cloud, self.lease_snapshot)
        self.provider = PluginClient(self.client)  # the typed client over it, as the daemon's own code calls it
        transport: PluginTransport = self.client
        self.lsf_runner: SimLsfRunner | None = None
        if legacy is not None:
            plugin, host, nursery = legacy
            oneshot = RuntimeConfig(settings.provider, settings.cluster, "/sim/lsf")
            transport, self.lsf_runner = legacy_client(plugin, host, oneshot, self.lease_snapshot, nursery)
        self.core = DaemonCore(
            config,
            connect=connect,
            events=self.events,
            rng=rng,
            instance=self.instance.replace("#", "-"),
            **lifecycle_options(settings, transport, rng),
        )
        if joined is not None:  # the slot's file of machines seen joined: this host's, across its restarts
            self.core.session.joined = joined
        if memory is not None:
            # The slot's state file: what this host's daemon remembers of the controller survives its restarts.
            guard = self.core.guard
            guard._store = memory
            guard.memory = memory.load()
        loop = getattr(self.core, "loop", None)
        if loop is not None and hasattr(loop, "state"):
            # The loop names its op_ids with a per-start incarnation it would draw from ``secrets``: draw it here.
            loop.state = attrs.evolve(loop.state, incarnation=f"{rng.getrandbits(32):08x}")

    def lease_snapshot(self) -> CallerLease:
        """The caller's lease now, read from the keeper's state (not from ``valid()``: the observer must not trust
        the code it checks)."""
        keeper = self.core.keepers[self.settings.provider]
        valid = keeper.state is LeaseState.HELD and trio.current_time() < keeper.valid_until
        return CallerLease(self.instance, self.identity, valid, keeper.epoch, keeper.valid_until)

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        self.recorder.note(self.instance, event, **{k: v for k, v in fields.items() if k != "valid_for"})
        if event in ("lease_acquired", "lease_renewed"):
            keeper = self.core.keepers[fields["provider"]]
            self.recorder.hold(self.instance, fields["provider"], fields["epoch"], keeper.valid_until)
        elif event in ("lease_lost", "lease_releasing", "lease_released"):
            self.recorder.release(self.instance, fields["provider"])
        elif event == "controller_amnesia" and self.instance in self.recorder.amnesiac:
            self.recorder.learned.add(self.instance)

    def kill(self) -> None:
        """The process dies now: nothing it believed survives, nothing it started continues (but the one-shot
        plugin calls it started, each in its own session)."""
        if self.lsf_runner is not None:
            self.lsf_runner.process_died()
        self.scope.cancel()
        self.recorder.release(self.instance)
        self.recorder.note(self.instance, "killed")

    async def stop(self) -> None:
        """A clean stop (SIGTERM): give the leases back while the link is up (bounded), then end the process."""
        if self.scope.cancel_called:
            return
        with trio.move_on_after(5.0):
            await self.core.release_leases()
        if self.lsf_runner is not None:
            self.lsf_runner.process_died()  # KillMode=process: its one-shot calls run on
        self.scope.cancel()
        self.recorder.release(self.instance)
        self.recorder.note(self.instance, "stopped")
