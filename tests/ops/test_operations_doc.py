"""docs/operations.md's configuration reference is checked against ``schemas/config.schema.json``: every key the
schema has is in the table, and the table names no key the schema lacks. Also: the README links the guide, and the
troubleshooting table names only events the daemon emits."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
SCHEMA = json.loads((ROOT / "schemas" / "config.schema.json").read_text())


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target = SCHEMA["$defs"][node["$ref"].removeprefix("#/$defs/")]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_keys(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted keys of every leaf; an array of tables is ``name[]``; a free-form table (``env``) is one key."""
    node = resolve(node)
    for name, child in node.get("properties", {}).items():
        child = resolve(child)
        path = f"{prefix}{name}"
        items = resolve(child.get("items", {}))
        if child.get("type") == "array" and "properties" in items:
            yield from schema_keys(items, f"{path}[].")
        elif "properties" in child:
            yield from schema_keys(child, f"{path}.")
        else:
            yield path


def doc_keys(text: str) -> list[str]:
    section = text.split("<!-- config-reference:start -->", 1)[1].split("<!-- config-reference:end -->", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]  # type: ignore[union-attr]


def test_the_reference_names_exactly_the_schemas_keys():
    schema = list(schema_keys(SCHEMA))
    documented = doc_keys(DOC.read_text())
    assert len(schema) > 50  # the walk reaches the nested tables
    assert sorted(set(schema) - set(documented)) == [], "in the schema, missing from docs/operations.md"
    assert sorted(set(documented) - set(schema)) == [], "in docs/operations.md, not in the schema"
    assert len(documented) == len(set(documented)), "a key documented twice"


def test_the_check_catches_a_missing_and_an_extra_key():
    text = DOC.read_text()
    assert "| `daemon.log_format` |" in text
    without = text.replace("| `daemon.log_format` |", "| `daemon.log_fmt` |")
    documented = set(doc_keys(without))
    schema = set(schema_keys(SCHEMA))
    assert schema - documented == {"daemon.log_format"} and documented - schema == {"daemon.log_fmt"}


def test_the_troubleshooting_table_names_events_the_daemon_emits():
    sources = "\n".join(p.read_text() for p in (ROOT / "provisionerd").rglob("*.py"))
    emitted = set(re.findall(r'emit\(\s*"([a-z_]+)"', sources))
    section = DOC.read_text().split("## Troubleshooting", 1)[1]
    named = set(re.findall(r"event `([a-z_]+)", section)) | set(re.findall(r"events `([a-z_]+)", section))
    assert named, "the table names events"
    assert named - emitted == set(), "events the daemon never emits"


def test_the_readme_links_the_guide():
    assert "docs/operations.md" in (ROOT / "README.md").read_text()
