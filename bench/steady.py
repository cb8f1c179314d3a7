"""100,000 live machines under the real daemon with the default config, for minutes (issue 18, "Done when").

Run from the repository root inside the project's environment::

    python bench/steady.py [--minutes 10] [--machines 100000] [--profile FILE] [--memory DIR [--tracemalloc N]]
                           [--loop-report FILE]

It fills the reference controller's store through the store API (``realprocs.fill``, as ``history.py`` does):
``--machines`` live machines of provider ``sim`` (request intents of 10, each with its instance facts, launched
now), in term 1; writes the simulated provider's state with the same machines running, tagged as the daemon tags
them; starts the real reference controller (``python -m refcontroller serve``, default flags) and the real daemon
(``python -m provisionerd run``) with a config that sets only what a site must (addresses, TLS files, the
provider's plugin and directories, the events log and admin socket) and ``max_machines`` to the fleet's size:
every ``[controller]``, ``[lease]`` and ``[providers.orphans]`` setting is the default (2 s heartbeats, 6 s
heartbeat timeout, orphan passes every 60 s after a 60 s settle). No demand is set and no worker joins: the
machines wait inside their 900 s join deadline, so at rest the daemon only keeps its link, its lease, its reclaim
polls and its orphan passes over the whole fleet.

The daemon's admin socket is polled every ``--poll`` seconds (15) and its events log read at the end. The last line
is JSON:

- ``link_ups`` / ``link_drops``: ``link_up`` and ``link_down`` events (one up and no drop is the target);
- ``lease_held_throughout``: from its first ``held`` every poll said ``held``, and no ``lease_lost`` event;
  ``lease_held_after_s``: when it was first held (after the grace a restarted controller gives the previous writer);
- ``orphan_passes``: completed passes (``orphan_pass`` events that skipped nothing), with ``orphan_findings`` of
  the last and ``orphan_known`` (the machines it compared); ``orphan_pass_done``: at least one completed;
- ``daemon_cpu_share_at_rest``: the daemon process's CPU time over wall time from its first completed orphan pass
  (the start-up resync done) to the end: periodic passes included (target < 0.05), and
  ``daemon_cpu_share_at_rest_without_polls`` without what this bench's own status queries cost it;
  ``plugin_cpu_share_at_rest`` the same for the persistent plugin process, ``controller_cpu_share_at_rest`` for
  the controller's;
  ``daemon_cpu_share_per_poll``: the daemon's share between two polls of that window (periodic work shows as
  peaks); ``status_query_cpu_ms``: what one admin ``status`` query costs the daemon (each poll makes one);
- ``daemon_rss_mb`` and ``daemon_peak_rss_mb``; ``max_hb_ack_age_s``: the largest ``last_heartbeat_ack_age`` a poll
  saw; ``actions``: provider calls the daemon made, by kind (none expected: no machine is idle or past a deadline).

``--memory DIR`` runs the daemon under ``bench/memprobe.py`` and, once the figures above are read, has it write
what its heap holds into ``DIR`` (objects and sizes per type, pymalloc's arenas and free blocks; with
``--tracemalloc N``, traced from the start ``N`` frames deep, the largest allocation sites: that doubles the
daemon's memory, so its RSS figures are then not the daemon's own). ``memory`` in the last line names the files.

The loop's figures come from ``bench/loopwatch.py`` (its docstring): the longest step, each pass's CPU, and
``long_loop_steps``, each step over 12 ms of CPU as ``[at_s, task, CPU ms, collector ms, frame]`` with the project's
frame most of its samples were in; ``--loop-report FILE`` keeps the watch's whole report (every sample of them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import realprocs
from realprocs import procs, token_hash

from provisionerd.config.loader import Config, ControllerSettings, DaemonSettings, ProviderConfig
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    Epoch,
    Fact,
    InstanceFact,
    RequestIntent,
)
from provisionerd.pki.certs import init_certs

REPO = Path(__file__).resolve().parents[1]
SIMULATED = REPO / "providers" / "simulated"
CLUSTER = "bench"
PROVIDER = "sim"
TEMPLATE = "sim-cpu-8"
EPOCH = Epoch(1, 1)
POLL = 15.0


def machine(n: int) -> tuple[str, str, str, str]:
    """(op, instance ref, machine id, address) of live machine ``n``."""
    return f"steady-{n // 10:05d}", f"{CLUSTER}/steady-{n:06d}", f"i-{n:017x}", f"10.{n >> 16}.{n >> 8 & 255}.{n & 255}"


def live_facts(count: int, launched: float) -> Iterator[Fact]:
    for start in range(0, count, 10):
        members = [machine(n) for n in range(start, min(start + 10, count))]
        op = members[0][0]
        refs = tuple(ref for _, ref, _, _ in members)
        yield RequestIntent(PROVIDER, EPOCH, op, TEMPLATE, len(refs), refs, tuple(map(token_hash, refs)), "d")
        for _, ref, mid, ip in members:
            host = "ip-" + ip.replace(".", "-")
            yield InstanceFact(PROVIDER, EPOCH, op, ref, mid, TEMPLATE, token_hash(ref), host, ip, launched)


def plugin_state(path: Path, count: int, launched: float) -> None:
    """The simulated provider's ``state.json`` (layout: ``simprovider/engine.py``) with the same machines running."""
    machines = {}
    for n in range(count):
        op, ref, mid, ip = machine(n)
        machines[mid] = {
            "machineId": mid,
            "name": "ip-" + ip.replace(".", "-"),
            "privateIpAddress": ip,
            "seq": n,
            "templateId": TEMPLATE,
            "requestId": f"req-{n // 10:06d}",
            "launchtime": int(launched),
            "state": "running",
            "tags": {
                TAG_CLUSTER: CLUSTER,
                TAG_PROVIDER: PROVIDER,
                TAG_OP: op,
                TAG_EPOCH: str(EPOCH),
                TAG_INSTANCE: ref,
            },
            "instanceRef": ref,
            "joinTokenSha256": token_hash(ref),
        }
    state = {"version": 1, "next": {"machine": count, "request": count // 10 + 1}, "ops": {}, "requests": {}}
    state.update(machines=machines, faults={})
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(state, f, separators=(",", ":"))


def write_config(path: Path, address: str, certs: Path, state: Path, plugin_data: Path, machines: int) -> None:
    """Only what a site must set (through the project's config writer); every timing is the default."""
    provider = ProviderConfig(
        PROVIDER,
        "persistent",
        path=SIMULATED / "provider",
        conf_dir=SIMULATED / "conf",
        data_dir=plugin_data,
        max_machines=machines,
    )
    config = Config(
        cluster=CLUSTER,
        identity="steady",
        controller=ControllerSettings((address,)),
        tls=provisioner_tls(certs),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
        providers=(provider,),
    )
    write_daemon_config(config, path)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def run(
    minutes: float,
    count: int,
    poll: float = POLL,
    profile: Path | None = None,
    memory: Path | None = None,
    traced: int = 0,
    loop_report: Path | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-steady-") as tmp:
        root = Path(tmp)
        certs, data, state, plugin_data = root / "certs", root / "data", root / "state", root / "plugin"
        init_certs(certs, CLUSTER)
        state.mkdir(mode=0o700)
        launched = time.time()
        facts, fill_s = realprocs.fill(data, live_facts(count, launched), "steady#fill", term=1)
        plugin_state(plugin_data / "state.json", count, launched)
        with realprocs.controller(certs, data) as (controller_pid, address):
            config = root / "daemon.toml"
            write_config(config, address, certs, state, plugin_data, count)
            loop = root / "loop.json"
            watching = [] if profile else [str(Path(__file__).with_name("loopwatch.py")), str(loop)]
            profiling = ["-m", "cProfile", "-o", str(profile)] if profile else []
            if memory is not None:  # the memory probe runs the daemon instead of the loop watch
                profiling = [str(REPO / "bench" / "memprobe.py"), "--out", str(memory), "--tracemalloc", str(traced)]
                watching = []
            argv = [sys.executable, *profiling, *watching, "-m", "provisionerd", "run", "--config", str(config)]
            with procs.popen(argv, root / "daemon.log") as daemon:
                try:
                    result = watch(daemon, controller_pid, state, minutes, poll)
                    if memory is not None:
                        result["memory"] = probe(daemon, memory)
                finally:
                    daemon.terminate()  # and up to a minute to stop (a profile is written on the way out)
                    try:
                        daemon.wait(60)
                    except subprocess.TimeoutExpired:
                        pass
            if loop.exists():  # written by the daemon's watch after every pass and at its exit
                result |= loop_summary(json.loads(loop.read_text()))
                if loop_report is not None:
                    loop_report.write_bytes(loop.read_bytes())
            return result | {"store_facts": facts, "fill_s": round(fill_s, 1)}


def loop_summary(report: dict[str, Any]) -> dict[str, Any]:
    """``bench/loopwatch.py``'s report as this bench's fields: the longest loop step (wall and CPU of the loop's
    thread, with the task), steps over 20 ms, and each orphan pass's CPU (the first pass comes with the start-up
    resync and its view building around it; the later ones are the passes at rest)."""
    passes = report["passes"]
    return {
        "orphan_pass_at_s": [p.get("at_s") for p in passes],
        "orphan_pass_cpu_s": [p["cpu_s"] for p in passes],
        "orphan_pass_wall_s": [p["wall_s"] for p in passes],
        "orphan_pass_max_step_ms": [p["max_step_ms"] for p in passes],
        "orphan_pass_gc_s": [p["gc_s"] for p in passes],
        "max_gc_ms": report["max_gc_ms"],
        "max_gc_generation": report["max_gc_generation"],
        "max_loop_step_ms": report["max_step_ms"],
        "max_loop_step_task": report["max_step_task"],
        "max_loop_step_cpu_ms": report["max_step_cpu_ms"],
        "max_loop_step_cpu_task": report["max_step_cpu_task"],
        "loop_steps_over_20ms": report["steps_over_20ms"],
        "loop_steps_over_20ms_cpu": report["steps_over_20ms_cpu"],
        "slow_loop_steps": report.get("slow_steps", []),
        "long_loop_steps": [_where(step) for step in report.get("long_steps", [])],
        "longest_loop_step_by_task_ms": report["longest_by_task_ms"],
        "longest_loop_step_by_task_cpu_ms": report["longest_by_task_cpu_ms"],
        "longest_loop_step_by_task_cpu_without_gc_ms": report["longest_by_task_cpu_without_gc_ms"],
    }


def _where(step: dict[str, Any]) -> list[Any]:
    """A long step (``loopwatch``'s ``long_steps``) as ``[at_s, task, CPU ms, collector ms, frame]``: the innermost
    frame of the project's code that most of its samples were in (``--loop-report`` keeps every sample)."""
    frames = [
        next((f for f in reversed(s) if "provisionerd/" in f or "/provisionerd" in f), s[-1])
        for s in step["samples"]
        if s
    ]
    where = max(set(frames), key=frames.count) if frames else ""
    return [step["at_s"], step["task"], step["cpu_ms"], step["gc_ms"], where]


def probe(daemon: subprocess.Popen[bytes], out: Path, timeout: float = 300.0) -> list[str]:
    """Have the daemon's ``bench/memprobe.py`` write its reports into ``out``; the files it wrote."""
    (out / "done").unlink(missing_ok=True)
    daemon.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not (out / "done").exists():
        if time.monotonic() > deadline or daemon.poll() is not None:
            raise RuntimeError(f"the daemon's memory probe wrote nothing into {out} within {timeout:g}s")
        time.sleep(0.5)
    return sorted(str(path) for path in out.iterdir() if path.name != "done")


def watch(
    daemon: subprocess.Popen[bytes], controller_pid: int, state: Path, minutes: float, poll: float
) -> dict[str, Any]:
    started = time.monotonic()
    end = started + 60 * minutes
    held_at: float | None = None
    unheld_after_held = 0
    max_ack_age = 0.0
    rest: dict[str, float] | None = None  # CPU seconds at the first completed orphan pass, and when
    polls = 0
    plugin_pid = 0
    timeline: list[tuple[float, float]] = []  # (when, daemon CPU seconds) at each poll of the rest window
    while time.monotonic() < end:
        time.sleep(poll)
        if rest is not None:
            timeline.append((time.monotonic(), realprocs.cpu_seconds(daemon.pid)))
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited with {daemon.returncode}")
        try:
            status = query(state / "admin.sock")["status"]
        except (OSError, ValueError, KeyError):
            continue
        polls += 1
        lease = {entry["provider"]: entry["state"] for entry in status["leases"]}.get(PROVIDER)
        if lease == "held" and held_at is None:
            held_at = time.monotonic() - started
        elif held_at is not None and lease != "held":
            unheld_after_held += 1
        max_ack_age = max(max_ack_age, status["link"]["last_heartbeat_ack_age"] or 0.0)
        if rest is None and completed_passes(events(state)):
            plugin_pid = next(iter(children(daemon.pid)), 0)
            rest = {
                "at": time.monotonic(),
                "daemon": realprocs.cpu_seconds(daemon.pid),
                "plugin": realprocs.cpu_seconds(plugin_pid) if plugin_pid else 0.0,
                "controller": realprocs.cpu_seconds(controller_pid),
            }
    rss, peak = realprocs.rss_mb(daemon.pid)
    out: dict[str, Any] = {"minutes": minutes, "polls": polls, "daemon_rss_mb": rss, "daemon_peak_rss_mb": peak}
    out["daemon_cpu_share_per_poll"] = [
        round((c1 - c0) / (t1 - t0), 3) for (t0, c0), (t1, c1) in zip(timeline, timeline[1:], strict=False)
    ]
    costs: list[float] = []
    for _ in range(3):  # what one status query costs the daemon (each poll above made one)
        before = realprocs.cpu_seconds(daemon.pid)
        query(state / "admin.sock")
        costs.append(realprocs.cpu_seconds(daemon.pid) - before)
    costs.sort()
    out["status_query_cpu_ms"] = round(1000 * costs[1], 1)
    if rest is not None:
        wall = time.monotonic() - rest["at"]
        out["rest_s"] = round(wall, 1)
        spent = realprocs.cpu_seconds(daemon.pid) - rest["daemon"]
        out["daemon_cpu_share_at_rest"] = round(spent / wall, 4)
        queries = len(timeline) + 3  # the polls of the window and the three measured just now
        out["daemon_cpu_share_at_rest_without_polls"] = round(max(0.0, spent - queries * costs[1]) / wall, 4)
        if plugin_pid:
            out["plugin_cpu_share_at_rest"] = round((realprocs.cpu_seconds(plugin_pid) - rest["plugin"]) / wall, 4)
        spent = realprocs.cpu_seconds(controller_pid) - rest["controller"]
        out["controller_cpu_share_at_rest"] = round(spent / wall, 4)
    log = events(state)
    kinds = [e.get("event") for e in log]
    passes = completed_passes(log)
    out.update(
        link_ups=kinds.count("link_up"),
        link_drops=kinds.count("link_down"),
        link_drop_reasons=sorted({str(e.get("reason")) for e in log if e.get("event") == "link_down"})[:5],
        lease_held_after_s=None if held_at is None else round(held_at, 1),
        lease_held_throughout=held_at is not None and unheld_after_held == 0 and "lease_lost" not in kinds,
        lease_lost=kinds.count("lease_lost"),
        orphan_passes=len(passes),
        orphan_pass_done=bool(passes),
        orphan_findings=passes[-1].get("findings") if passes else None,
        orphan_known=passes[-1].get("breaker", {}).get("known") if passes else None,
        orphan_skipped=sum(1 for e in log if e.get("event") == "orphan_pass" and e.get("skipped")),
        max_hb_ack_age_s=max_ack_age,
        actions=_count(f"{e.get('kind')}" for e in log if e.get("event") == "action" and e.get("phase") == "called"),
    )
    return out


def _count(names: Iterator[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def events(state: Path) -> list[dict[str, Any]]:
    path = state / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def completed_passes(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in log if e.get("event") == "orphan_pass" and not e.get("skipped")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--poll", type=float, default=POLL, help="seconds between two admin status queries")
    parser.add_argument("--profile", type=Path, help="run the daemon under cProfile, its stats written here")
    parser.add_argument("--memory", type=Path, help="run the daemon under bench/memprobe.py, its reports written here")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N", help="with --memory: trace N frames deep")
    parser.add_argument(
        "--loop-report", type=Path, help="keep bench/loopwatch.py's whole report (each long step's samples)"
    )
    args = parser.parse_args()
    if args.profile and args.memory:
        parser.error("--profile and --memory each run the daemon under their own wrapper: one at a time")
    profile, memory = args.profile and args.profile.resolve(), args.memory and args.memory.resolve()
    print(json.dumps(run(args.minutes, args.machines, args.poll, profile, memory, args.tracemalloc, args.loop_report)))
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    raise SystemExit(main())
