"""Render orphan findings for the admin: a table for people and the JSON document for tools.

Pure: strings in, strings out. The JSON document is the one ``provisionerd orphans --dry-run --json`` prints::

    {"findings": [{"class", "provider", "machine_id", "evidence", "action", "blocked_by"}], "mutations": 0}

and, when a provider cannot list machines (a legacy LSF plugin), also
``"invisible": {"<provider>": ["tagged_unknown", "ghost"]}`` and ``"unknown_outcomes": {"<provider>": [{"op_id",
"template", "instance_refs", "detail"}]}``: what the report cannot see there, instead of claiming none. An unknown
outcome also carries ``"records_from"`` and ``"plugin_records"`` (the plugin's own state file, through a reader
for its known layout: requests the journal does not account for, with their machines) or ``"cannot_see"`` (which
machines cannot be seen, and why).

``mutations`` is the number of provider mutations the command made: 0 for a dry run, by definition; the caller
passes its own count (taken from the provider call log) so the document states what happened, not what was meant.
Text that came from a provider (ids, names, tags) is escaped in the table so a hostile name cannot forge lines or
terminal escapes; the JSON is escaped by the encoder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from provisionerd.orphans.model import BreakerState, Finding, thaw

COLUMNS = ("CLASS", "PROVIDER", "MACHINE", "ACTION", "BLOCKED BY", "EVIDENCE")


def finding_document(finding: Finding) -> dict[str, Any]:
    """One finding as the JSON object of the report (keys in the documented order)."""
    return {
        "class": finding.orphan_class,
        "provider": finding.provider,
        "machine_id": finding.machine_id,
        "evidence": thaw(finding.evidence),
        "action": finding.action,
        "blocked_by": list(finding.blocked_by),
    }


def report_document(
    findings: Sequence[Finding],
    mutations: int = 0,
    invisible: Mapping[str, Sequence[str]] | None = None,
    unknown: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The JSON document. ``invisible`` (provider -> orphan classes its scan cannot see) and ``unknown``
    (provider -> its create requests with an unknown outcome) add the keys ``invisible`` and ``unknown_outcomes``
    when some provider cannot see a class; otherwise the document is exactly ``{"findings", "mutations"}``."""
    document: dict[str, Any] = {"findings": [finding_document(f) for f in findings], "mutations": mutations}
    blind = {name: list(classes) for name, classes in (invisible or {}).items() if classes}
    if blind:
        document["invisible"] = blind
        document["unknown_outcomes"] = {name: [dict(u) for u in (unknown or {}).get(name, ())] for name in blind}
    return document


def render_json(
    findings: Sequence[Finding],
    mutations: int = 0,
    invisible: Mapping[str, Sequence[str]] | None = None,
    unknown: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """The report as one JSON document (strict JSON: no NaN or Infinity)."""
    return json.dumps(report_document(findings, mutations, invisible, unknown), indent=2, allow_nan=False)


def blind_spots(
    invisible: Mapping[str, Sequence[str]] | None, unknown: Mapping[str, Sequence[Mapping[str, Any]]] | None
) -> list[str]:
    """One line per provider whose scan cannot see some classes (it lacks a listing), and one per request of it
    whose outcome is unknown: "none found" would be a false claim there."""
    lines = []
    for name, classes in sorted((invisible or {}).items()):
        if not classes:
            continue
        lines.append(
            f"provider {_clean(name)}: cannot list machines; invisible here: {', '.join(classes)} "
            "(not reported as none)"
        )
        for entry in (unknown or {}).get(name, ()):
            refs = ",".join(_clean(str(r)) for r in entry.get("instance_refs", ())) or "-"
            lines.append(
                f"provider {_clean(name)}: request {_clean(str(entry.get('op_id', '?')))} has an unknown "
                f"outcome (template {_clean(str(entry.get('template', '?')))}, refs {refs}): any machines "
                "it made are invisible"
            )
            lines.extend(_plugin_record_lines(name, entry))
    return lines


def _plugin_record_lines(name: str, entry: Mapping[str, Any]) -> list[str]:
    """What the plugin's own state file shows for an unknown outcome, or what cannot be seen."""
    where = f"provider {_clean(name)}:   "
    if entry.get("cannot_see"):
        return [f"{where}cannot see {_one_line(str(entry['cannot_see']))}"]
    if "records_from" not in entry:
        return []
    records = [r for r in entry.get("plugin_records", ()) if isinstance(r, Mapping)]
    source = _clean(str(entry["records_from"]))
    if not records:
        return [f"{where}{source} records no request the journal does not account for"]
    lines = []
    for record in records:
        machines = [m for m in record.get("machines", ()) if isinstance(m, Mapping)]
        listed = ", ".join(
            f"{_clean(str(m.get('machineId', '?')))} ({_clean(str(m.get('status', '') or '?'))}"
            f"{', returning' if m.get('returning') else ''})"
            for m in machines
        )
        lines.append(
            f"{where}{source} records request {_clean(str(record.get('requestId', '?')))} "
            f"(template {_clean(str(record.get('templateId', '') or '?'))}) the journal does not know: "
            f"{listed or 'no machines yet'}"
        )
    return lines


def render_table(
    findings: Sequence[Finding],
    mutations: int = 0,
    breaker: BreakerState | None = None,
    *,
    invisible: Mapping[str, Sequence[str]] | None = None,
    unknown: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """A fixed-width table, one row per finding, then a summary line (and why the breaker is open, if it is),
    then what some providers cannot see (``blind_spots``)."""
    blind = blind_spots(invisible, unknown)
    if not findings:
        return "\n".join([f"no orphan findings (mutations: {mutations})", *blind])
    rows = [
        (
            f.orphan_class,
            _clean(f.provider),
            _clean(f.machine_id),
            f.action,
            ",".join(f.blocked_by) or "-",
            summarize_evidence(f.evidence),
        )
        for f in findings
    ]
    widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in [COLUMNS, *rows]
    ]
    allowed = sum(1 for f in findings if f.allowed)
    lines.append(f"{len(findings)} finding(s), {allowed} action(s) allowed, mutations: {mutations}")
    if breaker is not None and breaker.open:
        lines.append(
            f"circuit breaker open: {', '.join(breaker.reasons)} "
            f"({breaker.suspects} of {breaker.known} known machines look orphaned)"
        )
    lines += blind
    return "\n".join(line.rstrip() for line in lines)


def summarize_evidence(evidence: Mapping[str, Any]) -> str:
    """The evidence an admin reads first, as ``key=value`` pairs (the JSON carries all of it)."""
    parts = []
    if evidence.get("age") is not None:  # a machine's since its launch, a licence grant's since its checkout
        parts.append(f"age={format_duration(evidence['age'])}")
    for key, label in (("op_id", "op"), ("fact_state", "fact"), ("not_found_reads", "misses")):
        if evidence.get(key) not in (None, ""):
            parts.append(f"{label}={_clean(str(evidence[key]))}")
    host = evidence.get("matching_host")
    if isinstance(host, Mapping):
        parts.append(f"host={_clean(host.get('hostname') or host.get('address') or host.get('instance_ref') or '?')}")
    if evidence.get("matching_hosts"):
        parts.append(f"hosts={len(evidence['matching_hosts'])}")
    if "granted" in evidence:
        in_use = "?" if evidence.get("in_use") is None else evidence["in_use"]
        idle = f" idle={evidence['idle']}" if "idle" in evidence else ""
        parts.append(f"granted={evidence['granted']} in_use={in_use}{idle}")
        if evidence.get("provider_in_use") is not None:
            parts.append(f"source_in_use={evidence['provider_in_use']}")
        parts.append(f"provider_agrees={'yes' if evidence.get('provider_agrees') else 'no'}")
    if evidence.get("epoch"):
        parts.append(f"epoch={evidence['epoch']}")
    return " ".join(parts) or "-"


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1h02m05s``; negative ages (a launch time in the future: clock skew) keep their sign."""
    sign = "-" if seconds < 0 else ""
    total = int(abs(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def _one_line(text: str) -> str:
    """A sentence kept readable (spaces stay) but on one line, with nothing unprintable."""
    return "".join(ch if ch == " " else _escape(ch) for ch in text)


def _clean(text: str) -> str:
    """Escape anything unprintable (newlines, ESC, ...) and spaces, so a cell stays one token on one line."""
    if text.isprintable() and " " not in text:
        return text
    return "".join(_escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch == " ":
        return "\\x20"
    return ch if ch.isprintable() else ch.encode("unicode_escape").decode()
