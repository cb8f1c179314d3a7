"""The shipped Grafana dashboard and Prometheus rules query only what the daemon exports (issue 32 item 6), and the
rules pass ``promtool check rules`` and their own unit tests (``promtool test rules``).

The exported names are read from the daemon's own registry (``DaemonMetrics``: every family it registers, the
status gauges included, rendered as a scrape renders them) here, and from a real scrape of an HA pair in
``tests/lifecycle/test_ha_metrics_real.py``; never from a hand-written list.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from rigs import backends
from rigs.metric_names import exported, queried

from provisionerd.telemetry.metrics import DaemonMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "contrib" / "grafana" / "provisionerd.json"
RULES = ROOT / "contrib" / "prometheus" / "provisionerd.rules.yml"
RULES_TEST = ROOT / "contrib" / "prometheus" / "provisionerd.rules.test.yml"
_TOKEN = re.compile(r"\b(?:provisionerd|process)_[a-z_]+\b")


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def rule_exprs() -> list[str]:
    return re.findall(r"^\s+expr: (.+)$", RULES.read_text(), re.MULTILINE)


def daemon_exports() -> set[str]:
    return exported(DaemonMetrics(lambda: {}).render().decode())


def test_every_metric_the_dashboard_queries_is_one_the_daemon_exports():
    names = queried(dashboard_exprs())
    tokens = {t for expr in dashboard_exprs() for t in _TOKEN.findall(expr)}
    assert tokens <= names, tokens - names  # the parser misses no name the expressions spell out
    assert names - daemon_exports() == set()


def test_the_dashboard_shows_what_an_operator_needs():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    titles = {panel["title"] for panel in panels}
    assert {
        "Machines by state per provider",
        "Demand vs supply",
        "Calls by action and outcome",
        "Call latency p95",
        "Lease held, per daemon",
        "Controller link",
        "Estimated spend per hour",
        "Orphan findings",
    } <= titles
    names = queried(dashboard_exprs())
    for needed in ("provisionerd_machines", "provisionerd_estimated_spend_total", "provisionerd_orphan_findings_total"):
        assert needed in names
    assert len({panel["id"] for panel in panels}) == len(panels)


def test_every_metric_the_rules_query_is_one_the_daemon_exports():
    exprs = rule_exprs()
    assert len(exprs) >= 8
    assert queried(exprs) - daemon_exports() == set()


def test_every_alert_of_docs_metrics_md_is_in_the_rules_file():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    alerts = re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.MULTILINE)
    assert alerts and all(f"`{name}`" in doc for name in alerts), alerts


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = backends.need("promtool", "Debian: prometheus")
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.integration
def test_promtool_checks_the_rules():
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


@pytest.mark.integration
def test_promtool_unit_tests_every_alert():
    result = promtool("test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.MULTILINE))
    assert tested == alerts  # every alert has a test


@pytest.mark.integration
def test_every_dashboard_query_is_valid_promql(tmp_path):
    """Each query (Grafana's variables given values) as a recording rule: ``promtool check rules`` parses it."""
    values = {"$__rate_interval": "5m", "$__range": "6h", "$job": ".*", "$provider": ".*"}
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(dashboard_exprs()):
        for variable, value in values.items():
            expr = expr.replace(variable, value)
        lines += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(expr)}"]
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text("\n".join(lines) + "\n")
    result = promtool("check", "rules", rules)
    assert result.returncode == 0, result.stdout + result.stderr
