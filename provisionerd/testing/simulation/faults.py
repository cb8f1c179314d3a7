"""The fault schedule of one run, drawn from the seed before the run starts (so it is part of what the seed fixes).

A ``Fault`` starts at ``at`` (virtual seconds from the start) and, when it has a ``duration``, is undone at
``at + duration``. Kinds:

``failover``        the primary hands over to another replica in a new term (every session of the old one is cut)
``quorum_loss``     the primary sees no fresh quorum: no grants, renewals or commits until it returns
``partition``       one daemon slot's traffic in one or both directions is dropped or stalled (``mode``)
``drop_pushes``     the controller's pushes (demand pages, host states) to one slot are lost
``delay``           one direction of a slot gets ``delay`` seconds of extra latency
``kill``            a daemon slot's process dies (memory gone) and a fresh one starts ``duration`` later
``provider_fault``  provider calls fail (``mode``: reject | hang | crash | garbage) at ``rate``
``provider_slow``   provider calls take ``factor`` times longer
``vanish``          a running machine disappears behind the daemons' backs
``no_join``         machines created meanwhile never join the controller (lifecycle runs)
``bad_machines``    machines created meanwhile join reporting fewer CPUs than their template declares: the daemon
                    must return each (``capability_mismatch``) and replace it (lifecycle runs)
``twin``            a second live daemon with slot ``slot``'s identity (the same config on another host) starts,
                    competes for the provider, and after ``duration`` stops (``mode``: kill | stop, i.e. crash or
                    clean stop with its leases released)
``storage_failure`` the controller's disk is full (SQLite's ``max_page_count`` at the store's size): every write
                    that needs one more page is answered ``storage_failure`` (commits, grants to a new holder, worker
                    token uses; demand changes and failovers are refused to the admin) until it is freed
``store_loss``      the controller comes back on an empty store, a new incarnation (term 1 again, no facts, the
                    demand sent again by the scheduler): every daemon that remembers the old one must halt, make no
                    provider mutation and keep every machine; after ``duration`` the admin accepts the reset
                    (``accept-reset``) and the run goes on
``controller_restart`` the controller process restarts on its good store (lifecycle runs): its host table, kept
                    in memory only, is empty; every session is cut; each joined worker still running rejoins with
                    its credential 1-40 s later. Machines older than the join deadline must not be returned as never
                    joined (the invariant ``joined_retired_as_never_joined``)
``foreign_id``      the cloud's ``requestMachines`` takes effect, then answers (at ``rate``) a requestId it never
                    made, which its status call reports as an unknown request (issue 31 finding 3): the daemon must
                    settle the op from its listing, never leave a machine without a fact nor ask again meanwhile
``kill_mid_call``   slot ``slot``'s daemon is killed at its next provider mutation, while the call is under way (the
                    cloud completes it: a one-shot call runs on in its own session), and starts again ``duration``
                    later: its recovery must find what the call made (issue 31 item 7)
``agent_restart``   a share (``value``) of the joined workers' agents die and are restarted by their machine's init
                    system 0.5-10 s later (lifecycle runs): each rejoins with the credential its state file kept
                    (``--state-file``, issue 31 item 7). A restarted agent of a running machine the daemon has not
                    returned must be admitted again (the invariant ``agent_rejoin_refused``)
``reload``          one slot's daemon gets an admin orphan action (``admin``) and, while it is under way, a config
                    reload (``mode``: a live change or one that needs a restart; ``value``); a live change is undone
                    at the fault's end (``reload_fault``)

Faults may overlap; the undo of one restores the normal state of what it touched (a later overlapping fault of the
same kind may therefore end early). ``quiet_after`` is when the last fault is undone: from then on the world is
healthy and the run only settles.
"""

from __future__ import annotations

import random

import attrs

from provisionerd.testing.simulation.cloud import FAULT_KINDS

#: The kinds drawn one by one, with these relative weights.
WEIGHTED = (
    "failover",
    "quorum_loss",
    "partition",
    "drop_pushes",
    "delay",
    "kill",
    "provider_fault",
    "provider_slow",
    "vanish",
    "no_join",
)
WEIGHTS = (3, 2, 4, 1, 2, 2, 3, 1, 1, 1)
#: Every kind. A ``twin`` is drawn after the others (at most one per run, with ``TWIN_CHANCE``), so the kinds and
#: times drawn before it are the same as before it existed.
KINDS = (
    *WEIGHTED,
    "twin",
    "storage_failure",
    "store_loss",
    "bad_machines",
    "reload",
    "controller_restart",
    "foreign_id",
    "kill_mid_call",
    "agent_restart",
)
TWIN_CHANCE = 0.3
#: Storage faults are drawn after the twin, each with its own chance, for the same reason.
STORAGE_FAILURE_CHANCE = 0.25
STORE_LOSS_CHANCE = 0.15
#: A reload during an admin action is drawn last, with its own chance (the same reason).
RELOAD_CHANCE = 0.25
RELOAD_CHANGES = ("cap_down", "idle_time", "rename", "addresses")
RELOAD_ADMIN = ("adopt_dry", "adopt", "adopt_missing", "return_missing")
#: Machines that join short of their template (issue 20 item 1): drawn after the storage faults (the same reason),
#: before the reload (which stays last).
BAD_MACHINES_CHANCE = 0.25
#: A controller process restart (issue 31 finding 1): drawn after everything else, so every other draw is the same
#: as before it existed; late in the run, when machines are older than the join deadline.
CONTROLLER_RESTART_CHANCE = 0.3
#: A cloud answering foreign request ids (issue 31 finding 3): drawn after the controller restart (the same reason).
FOREIGN_ID_CHANCE = 0.2
#: A daemon killed in the middle of a provider mutation (issue 31 item 7): drawn after the foreign ids.
KILL_MID_CALL_CHANCE = 0.3
#: Agents restarted on their machines (issue 31 item 7, "agent restarts"): drawn after the kill mid-call.
AGENT_RESTART_CHANCE = 0.3
#: Not a fault: the share of lifecycle worlds whose provider is a slow LSF one-shot plugin behind the legacy adapter
#: (issue 31 item 7, "legacy mode included"; ``lsf.py``) when a campaign asks for them (``simulate --legacy-share``).
LEGACY_CHANCE = 0.3
#: Not a fault either: the share of lifecycle worlds with a fleet policy (warm headroom, half of them a CPU limit
#: too; issue 35), drawn by ``World`` after the legacy world (``simulate --fleet-share``).
FLEET_CHANCE = 0.3
#: The share of lifecycle worlds where one joined machine gets a spot interruption notice (issue 34 item 4): its
#: worker reports ``reclaim_at``, and the cloud takes it back then. Drawn by ``World`` after the fleet policy
#: (``simulate --notice-share``).
NOTICE_CHANCE = 0.3
#: The share of lifecycle worlds whose demand item is all or nothing (issue 35 item 5): the daemon asks for its
#: machines whole, and the cloud breaks the promise on a share of those requests (it launches one fewer), which the
#: daemon must return whole. Drawn by ``World`` after the notice (``simulate --gang-share``).
GANG_CHANCE = 0.3
#: The share of lifecycle worlds whose provider offers two templates at two priorities (issue 35 item 3): ``small``
#: (priority 0) holds 2-5 machines, ``spare`` (priority 1) the rest, so demand beyond ``small`` goes to ``spare`` and
#: surplus ``spare`` machines go back first. Drawn by ``World`` after the all-or-nothing demand
#: (``simulate --priority-share``).
PRIORITY_CHANCE = 0.3


@attrs.frozen
class Fault:
    at: float
    kind: str
    duration: float = 0.0
    slot: str = ""
    direction: str = ""  # c2s | s2c | both
    mode: str = ""  # partition: drop | stall; provider_fault: a cloud fault kind
    value: float = 0.0  # delay seconds, provider fault rate, slow factor, failover target replica, reload value
    admin: str = ""  # reload: the admin's orphan action (``RELOAD_ADMIN``)

    @property
    def ends(self) -> float:
        return self.at + self.duration

    def describe(self) -> dict[str, object]:
        return {k: v for k, v in attrs.asdict(self).items() if v not in ("", 0.0) or k == "at"}


@attrs.frozen
class FaultPlan:
    faults: tuple[Fault, ...]

    @property
    def quiet_after(self) -> float:
        return max((f.ends for f in self.faults), default=0.0)

    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}


def draw_plan(
    rng: random.Random,
    *,
    horizon: float,
    slots: tuple[str, ...],
    replicas: int,
    max_faults: int = 10,
    kinds: tuple[str, ...] = KINDS,
) -> FaultPlan:
    """Between 0 and ``max_faults`` faults starting in ``[5, horizon)``, and perhaps a twin (only when
    ``max_faults`` allows faults at all); each undone by ``horizon``."""
    weights = [w for k, w in zip(WEIGHTED, WEIGHTS, strict=True) if k in kinds]
    chosen = [k for k in WEIGHTED if k in kinds]
    faults = []
    for _ in range(rng.randint(0, max_faults) if chosen else 0):
        at = round(rng.uniform(5.0, horizon * 0.9), 3)
        kind = rng.choices(chosen, weights)[0]
        room = horizon - at
        duration = round(min(room, rng.choice((rng.uniform(1, 10), rng.uniform(5, 60), rng.uniform(30, 120)))), 3)
        slot = rng.choice(slots)
        match kind:
            case "failover":
                faults.append(Fault(at, kind, value=float(rng.randrange(replicas))))
            case "quorum_loss":
                faults.append(Fault(at, kind, duration))
            case "partition":
                faults.append(
                    Fault(at, kind, duration, slot, rng.choice(("c2s", "s2c", "both")), rng.choice(("drop", "stall")))
                )
            case "drop_pushes":
                faults.append(Fault(at, kind, duration, slot, "s2c"))
            case "delay":
                faults.append(
                    Fault(
                        at,
                        kind,
                        duration,
                        slot,
                        rng.choice(("c2s", "s2c")),
                        value=round(rng.choice((rng.uniform(0.1, 2), rng.uniform(2, 12))), 3),
                    )
                )
            case "kill":
                faults.append(Fault(at, kind, round(min(room, rng.uniform(0, 40)), 3), slot))
            case "provider_fault":
                faults.append(
                    Fault(at, kind, duration, mode=rng.choice(FAULT_KINDS), value=round(rng.uniform(0.2, 1.0), 3))
                )
            case "provider_slow":
                faults.append(Fault(at, kind, duration, value=round(rng.uniform(2, 20), 3)))
            case "vanish":
                faults.append(Fault(at, kind))
            case "no_join":
                faults.append(Fault(at, kind, duration))
    if "twin" in kinds and max_faults > 0 and rng.random() < TWIN_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.8), 3)
        duration = round(min(horizon - at, rng.uniform(10.0, 120.0)), 3)
        faults.append(Fault(at, "twin", duration, rng.choice(slots), mode=rng.choice(("kill", "stop"))))
    if "storage_failure" in kinds and max_faults > 0 and rng.random() < STORAGE_FAILURE_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.8), 3)
        faults.append(Fault(at, "storage_failure", round(min(horizon - at, rng.uniform(5.0, 90.0)), 3)))
    if "store_loss" in kinds and max_faults > 0 and rng.random() < STORE_LOSS_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.7), 3)
        faults.append(Fault(at, "store_loss", round(min(horizon - at, rng.uniform(5.0, 60.0)), 3)))
    if "bad_machines" in kinds and max_faults > 0 and rng.random() < BAD_MACHINES_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.7), 3)
        faults.append(Fault(at, "bad_machines", round(min(horizon - at, rng.uniform(10.0, 90.0)), 3)))
    if "reload" in kinds and max_faults > 0 and rng.random() < RELOAD_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.8), 3)
        mode = rng.choice(RELOAD_CHANGES)
        value = float(rng.randint(0, 3)) if mode == "cap_down" else round(rng.uniform(5.0, 120.0), 3)
        duration = round(min(horizon - at, rng.uniform(10.0, 90.0)), 3)
        faults.append(
            Fault(at, "reload", duration, rng.choice(slots), mode=mode, value=value, admin=rng.choice(RELOAD_ADMIN))
        )
    if "controller_restart" in kinds and max_faults > 0 and rng.random() < CONTROLLER_RESTART_CHANCE:
        faults.append(Fault(round(rng.uniform(horizon * 0.4, horizon * 0.9), 3), "controller_restart"))
    if "foreign_id" in kinds and max_faults > 0 and rng.random() < FOREIGN_ID_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.7), 3)
        duration = round(min(horizon - at, rng.uniform(10.0, 90.0)), 3)
        faults.append(Fault(at, "foreign_id", duration, value=round(rng.uniform(0.3, 1.0), 3)))
    if "kill_mid_call" in kinds and max_faults > 0 and rng.random() < KILL_MID_CALL_CHANCE:
        at = round(rng.uniform(5.0, horizon * 0.7), 3)
        faults.append(Fault(at, "kill_mid_call", round(rng.uniform(0.3, 20.0), 3), rng.choice(slots)))
    if "agent_restart" in kinds and max_faults > 0 and rng.random() < AGENT_RESTART_CHANCE:
        at = round(rng.uniform(horizon * 0.2, horizon * 0.9), 3)
        faults.append(Fault(at, "agent_restart", value=round(rng.uniform(0.2, 1.0), 3)))
    return FaultPlan(tuple(sorted(faults, key=lambda f: (f.at, f.kind, f.slot))))
