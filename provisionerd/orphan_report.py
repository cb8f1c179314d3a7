"""Render orphan findings for the admin: a table for people and the JSON document for tools.

Pure: strings in, strings out. The JSON document is the one ``provisionerd orphans --dry-run --json`` prints::

    {"findings": [{"class", "provider", "machine_id", "evidence", "action", "blocked_by"}], "mutations": 0}

``mutations`` is the number of provider mutations the command made: 0 for a dry run, by definition; the caller
passes its own count (taken from the provider call log) so the document states what happened, not what was meant.
Text that came from a provider (ids, names, tags) is escaped in the table so a hostile name cannot forge lines or
terminal escapes; the JSON is escaped by the encoder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from provisionerd.orphan_model import BreakerState, Finding, thaw

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


def report_document(findings: Sequence[Finding], mutations: int = 0) -> dict[str, Any]:
    return {"findings": [finding_document(f) for f in findings], "mutations": mutations}


def render_json(findings: Sequence[Finding], mutations: int = 0) -> str:
    """The report as one JSON document (strict JSON: no NaN or Infinity)."""
    return json.dumps(report_document(findings, mutations), indent=2, allow_nan=False)


def render_table(findings: Sequence[Finding], mutations: int = 0, breaker: BreakerState | None = None) -> str:
    """A fixed-width table, one row per finding, then a summary line (and why the breaker is open, if it is)."""
    if not findings:
        return f"no orphan findings (mutations: {mutations})"
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
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths)) + "  " + row[-1]
        for row in [COLUMNS, *rows]
    ]
    allowed = sum(1 for f in findings if f.allowed)
    lines.append(f"{len(findings)} finding(s), {allowed} action(s) allowed, mutations: {mutations}")
    if breaker is not None and breaker.open:
        lines.append(
            f"circuit breaker open: {', '.join(breaker.reasons)} "
            f"({breaker.suspects} of {breaker.known} known machines look orphaned)"
        )
    return "\n".join(line.rstrip() for line in lines)


def summarize_evidence(evidence: Mapping[str, Any]) -> str:
    """The evidence an admin reads first, as ``key=value`` pairs (the JSON carries all of it)."""
    parts = []
    if evidence.get("age") is not None:
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
        parts.append(f"granted={evidence['granted']} in_use={evidence['in_use']}")
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


def _clean(text: str) -> str:
    """Escape anything unprintable (newlines, ESC, ...) and spaces, so a cell stays one token on one line."""
    if text.isprintable() and " " not in text:
        return text
    return "".join(_escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch == " ":
        return "\\x20"
    return ch if ch.isprintable() else ch.encode("unicode_escape").decode()
