"""The operator's docs stay true to the code (issue 32 item 9): the demand item schema, the certificate files, the
levels of the faults, and the wordings that were wrong (``orphans.grace``, ``step_limit``, partial reloads)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from provisionerd.config.demand_doc import SCHEMA
from provisionerd.pki.certs import init_certs
from provisionerd.telemetry.severity import SEVERITY

ROOT = Path(__file__).resolve().parents[2]
OPS = (ROOT / "docs" / "operations.md").read_text()


def section(title: str) -> str:
    start = OPS.index(f"\n## {title}\n")
    end = OPS.find("\n## ", start + 1)
    return OPS[start:end]


def test_the_demand_item_table_names_every_field_the_schema_accepts():
    controller = section("The controller")
    item = SCHEMA["items"]
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", controller, re.M))
    fields = set(item["properties"]) | {f"shape.{k}" for k in item["properties"]["shape"]["properties"]}
    assert documented == fields
    for required in item["required"]:
        assert re.search(rf"^\| `{required}` \| [^|]*\*\*required\*\*", controller, re.M), required


def test_the_certificates_table_places_every_file_certs_init_writes(tmp_path):
    certificates = section("Certificates")
    for path in init_certs(tmp_path, "docs"):
        assert f"`{path.name}`" in certificates, path.name
    assert "**no host below**" in certificates  # the CA key stays off every host


def test_every_fault_level_is_named_in_the_logs_section():
    logs = section("Logs")
    for kind, level in SEVERITY.items():
        if level >= logging.WARNING:
            assert f"`{kind}`" in logs, kind


def test_the_wordings_that_were_wrong_are_gone():
    example = (ROOT / "docs" / "example-config.toml").read_text()
    assert "at most this many machines requested in one step" not in example
    assert "the floor of the adaptive step" in example
    assert "A machine younger than this is never an orphan" not in OPS
    assert "sections in `restart_needed` take effect at the next restart" not in OPS
    assert "applies **none** of its changes, the live ones included" not in OPS  # issue 32 item 5: no longer so
    assert "without holding the live changes of the same file back" in OPS
    # The text log example is what the formatter writes: "<time> <LEVEL> <logger>: <message>".
    assert "INFO provisionerd.events: lease_acquired provider=ec2 epoch=3.1" in OPS
