"""``provisionerd status``: ask a running daemon (through its admin socket) for its link, leases and providers.

Per provider: the lease, machines by state, demand wanted vs supplied, the last provider call, the back-offs in
force, the unhealthy state, and the four checks kept apart (access, connectivity, readiness, capacity: see
docs/metrics.md).

``--socket PATH`` or ``--config FILE`` (its ``daemon.admin_socket``, read alone when the file no longer loads as a
whole: ``status`` answers while a refused edit sits on disk). ``--json`` prints the raw document. Exit 0
when the daemon answers and is ready, 3 when it answers but is not ready (the document's ``ready.ok``: the reasons
are printed), 1 when it cannot be reached or the config names no socket, 2 on usage errors, so a script or a
monitor can test ``provisionerd status`` alone.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from provisionerd.cli.admin_target import add_target, ask


def render(status: dict[str, Any]) -> list[str]:
    link = status.get("link", {})
    lines = [
        f"daemon {status.get('identity')!r} of cluster {status.get('cluster')!r}",
        f"link: {link.get('state')}  primary: {link.get('primary') or '-'}  term: {link.get('term')}"
        f"  generation: {link.get('generation')}  demand seq: {link.get('demand_seq')}",
    ]
    if link.get("last_error") and link.get("state") != "up":  # an old error is history once the link is back up
        lines.append(f"last link error: {link['last_error']}")
    finding = status.get("controller", {}).get("finding")
    if finding:
        lines.append(f"CONTROLLER AMNESIA ({finding.get('reason')}): {finding.get('detail')}")
        lines.append(
            "  every mutation is stopped; after checking, run: provisionerd controller accept-reset --config FILE"
        )
    providers = status.get("providers")
    if isinstance(providers, dict) and providers:
        for name, entry in providers.items():
            lines.extend(render_provider(name, entry))
    else:  # a daemon from before per-provider status
        for lease in status.get("leases", []):
            remaining = lease.get("remaining")
            validity = f"valid for {remaining:.1f}s" if isinstance(remaining, (int, float)) else "not valid"
            lines.append(
                f"provider {lease['provider']!r}: {lease['state']}  epoch {lease.get('epoch') or '-'}  {validity}"
                f"  ({lease.get('reason', '')})"
            )
    demand = status.get("demand")
    if isinstance(demand, dict):
        lines.append(f"demand: {demand.get('wanted')} wanted, {demand.get('unplaced')} not placed on any provider")
    ready, health = status.get("ready"), status.get("health")
    if isinstance(ready, dict):
        why = "; ".join(str(r) for r in ready.get("reasons", []))
        lines.append(f"ready: {'yes' if ready.get('ok') else 'no'}" + (f" ({why})" if why else ""))
    if isinstance(health, dict):
        lines.append(f"alive: {'yes' if health.get('live') else 'NO'} ({health.get('detail')})")
    return lines


def render_provider(name: str, p: dict[str, Any]) -> list[str]:
    """One provider's block: lease, machines, demand, last call, back-offs, health and the four checks."""
    lease = p.get("lease", {})
    remaining = lease.get("remaining")
    validity = f"valid for {remaining:.1f}s" if isinstance(remaining, (int, float)) else "not valid"
    standby = "  STANDBY (another holder has it)" if lease.get("standby") else ""
    lines = [
        f"provider {name!r}: lease {lease.get('state')}  epoch {lease.get('epoch') or '-'}  {validity}"
        f"  ({lease.get('reason', '')}){standby}"
    ]
    machines = p.get("machines", {})
    draining = p.get("draining")
    lines.append(
        "  machines: "
        + "  ".join(f"{state} {n}" for state, n in machines.items())
        + (f"  (draining {draining})" if isinstance(draining, int) and draining else "")
    )
    demand = p.get("demand", {})
    by_template = demand.get("by_template", {})
    per = ", ".join(f"{t} {d.get('wanted')}/{d.get('supplied')}" for t, d in by_template.items())
    lines.append(
        f"  demand: {demand.get('wanted', 0)} wanted, {demand.get('supplied', 0)} supplied"
        + (f"  (template wanted/supplied: {per})" if per else "")
    )
    last = p.get("last_call")
    if isinstance(last, dict):
        lines.append(
            f"  last call: {last.get('action')} {last.get('outcome')} {last.get('age_s')}s ago"
            f" (took {last.get('seconds')}s)"
        )
    else:
        lines.append("  last call: none yet")
    details = p.get("backoff_details", [])
    if details:
        parts = []
        for d in details:
            label = d.get("template") or d.get("code") or ""
            ends = d.get("ends_in_s", d.get("next_probe_in_s"))
            parts.append(f"{d.get('kind')}{' ' + label if label else ''} ({ends}s left)")
        lines.append("  back-offs: " + ", ".join(parts))
    else:
        lines.append("  back-offs: none")
    step = p.get("step")
    if isinstance(step, dict) and step.get("step") is not None:
        lines.append(
            f"  step: {step['step']} per {step.get('interval_s')}s  (floor {step.get('floor')}, cap {step.get('cap')},"
            f" {step.get('reason')})"
        )
    rejoin = p.get("rejoin")
    if isinstance(rejoin, dict) and not rejoin.get("settled"):
        lines.append(
            f"  settling after a controller (re)join: {rejoin.get('missing')} machine(s) that joined before not back"
            f" yet; no machine is retired for not joining until they are, or for {rejoin.get('settle_s')}s"
        )
    offers = p.get("offers")
    if isinstance(offers, dict) and offers.get("error"):
        kept = (
            f"the offers read {offers.get('age_s')}s ago are kept"
            + (" (stale: no new machine from them)" if offers.get("stale") else "")
            if offers.get("read")
            else "no offers read yet"
        )
        lines.append(
            f"  offers: last read failed ({offers.get('failures')} in a row: {offers.get('error')}); {kept};"
            f" read again in {offers.get('retry_in_s')}s"
        )
    health = p.get("health", {})
    if health.get("state") == "unhealthy":
        lines.append(
            f"  UNHEALTHY: {health.get('code')}: {health.get('detail')}  ({health.get('failures')} failures,"
            f" next probe in {health.get('next_probe_in_s')}s)"
        )
    machines = health.get("machines")
    if isinstance(machines, dict) and machines.get("protected"):
        lines.append(f"  PROTECTED: {machines.get('reason')}  (eases in {machines.get('eases_in_s')}s)")
    elif isinstance(machines, dict):
        lines.append(
            f"  unhealthy machines: {machines.get('unhealthy')} within {machines.get('window_s')}s"
            f" (max_unhealthy {machines.get('max_unhealthy')})"
        )
    for check in ("access", "connectivity", "readiness", "capacity"):
        c = p.get("checks", {}).get(check, {})
        lines.append(f"  {check:<12} {c.get('state', '?'):<8} {c.get('detail', '')}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="provisionerd status",
        description="show a running daemon's state",
        epilog=(
            "exit status: 0 the daemon answered and is ready; 3 it answered but is not ready (the reasons are"
            " printed); 1 it cannot be reached; 2 usage error"
        ),
    )
    add_target(parser)
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    reply = ask("provisionerd status", args, "status")
    if reply is None:
        return 1
    if args.json:
        print(json.dumps(reply["status"], indent=2, sort_keys=True))
    else:
        print("\n".join(render(reply["status"])))
    return 0 if is_ready(reply["status"]) else NOT_READY


#: The exit status of an answer that says the daemon is not ready (as ``systemctl is-active`` uses 3 for inactive).
NOT_READY = 3


def is_ready(status: dict[str, Any]) -> bool:
    """Whether the status document says ready (a daemon from before the ``ready`` section counts as ready)."""
    ready = status.get("ready")
    return not isinstance(ready, dict) or bool(ready.get("ok"))
