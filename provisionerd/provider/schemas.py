"""The provider contract's JSON Schemas, loaded and compiled once per process.

``schemas/<action>.input.json`` and ``schemas/<action>.output.json`` describe each action; ``schemas/defs.json``
holds the shared definitions and ``schemas/error.json`` the error document. Building a validator re-checks the
schema and resolves references, which costs far more than validating one document (notes/trio-patterns.md), so the
validators are built at first use and reused for every call.

``date-time`` is checked by our own RFC 3339 function registered on a private format checker, so the result does
not depend on which optional packages happen to be installed next to jsonschema.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import referencing
from jsonschema.protocols import Validator

from provisionerd.provider.fastcheck import Compiler, Predicate, UnsupportedSchema
from provisionerd.resources import schema_dir

#: Every action of the contract. The first five are the LSF resource connector's; the rest are our extensions.
ACTIONS = (
    "getAvailableTemplates",
    "requestMachines",
    "requestReturnMachines",
    "getRequestStatus",
    "getReturnRequests",
    "describeProvider",
    "listMachines",
    "stopMachines",
)
#: Actions that change the infrastructure: they carry ``op_id`` and owner tags.
MUTATING = frozenset({"requestMachines", "requestReturnMachines", "stopMachines"})

SCHEMA_DIR = schema_dir()  # inside the installed package (provisionerd/resources)
_MAX_PROBLEMS = 10
_MAX_PROBLEM_CHARS = 300

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def is_rfc3339(instance: object) -> bool:
    """RFC 3339 ``date-time``: the shape by regex, the calendar (month 13, Feb 30) by ``datetime``."""
    if not isinstance(instance, str):
        return True  # JSON Schema: formats only constrain their own type
    if not _RFC3339.match(instance):
        return False
    text = instance.upper().replace("Z", "+00:00")
    seconds = text[17:19]
    if seconds == "60":  # a leap second is valid RFC 3339; datetime cannot hold it
        text = text[:17] + "59" + text[19:]
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


FORMAT_CHECKER = jsonschema.FormatChecker(formats=())
FORMAT_CHECKER.checks("date-time")(is_rfc3339)


def _schema_files(directory: Path) -> Iterable[Path]:
    yield directory / "defs.json"
    yield directory / "error.json"
    for action in ACTIONS:
        yield directory / f"{action}.input.json"
        yield directory / f"{action}.output.json"


class ContractSchemas:
    """The compiled validators of every action's input and output, plus the error document's.

    ``input_problems``/``output_problems`` return a list of ``"<json path>: <message>"`` strings (empty = valid),
    at most ``_MAX_PROBLEMS`` of them, each shortened. Messages quote the offending values, so callers must pass
    them through their redactor before they reach an error or a log.
    """

    def __init__(self, directory: Path = SCHEMA_DIR) -> None:
        documents: dict[str, Any] = {}
        resources = []
        for path in _schema_files(directory):
            document = json.loads(path.read_text(encoding="utf-8"))
            documents[path.name] = document
            resources.append((document["$id"], referencing.Resource.from_contents(document)))
        registry: referencing.Registry = referencing.Registry().with_resources(resources)
        self.documents: Mapping[str, Any] = documents
        self._validators: dict[str, Validator] = {}
        self._fast: dict[str, Predicate] = {}
        compiler = Compiler({d["$id"]: d for d in documents.values()}, {"date-time": is_rfc3339})
        for name, document in documents.items():
            cls = jsonschema.validators.validator_for(document)
            cls.check_schema(document)  # once, here: a broken schema file fails at load, not per call
            validator = cls(document, registry=registry, format_checker=FORMAT_CHECKER)
            self._validators[name] = validator
            try:
                self._fast[name] = compiler.compile(document["$id"])
            except UnsupportedSchema:
                self._fast[name] = validator.is_valid

    def validator(self, name: str) -> Validator:
        return self._validators[name]

    def input_problems(self, action: str, document: object) -> list[str]:
        problems = self._problems(f"{action}.input.json", document)
        # ``action in MUTATING`` first: the polls, most calls, skip the ABC isinstance check and a call.
        if not problems and action in MUTATING and isinstance(document, Mapping):
            problems = _input_semantics(action, document)
        return problems

    def output_problems(self, action: str, document: object) -> list[str]:
        return self._problems(f"{action}.output.json", document)

    def error_problems(self, document: object) -> list[str]:
        """Problems of a one-shot error document ``{"error": {...}}``."""
        return self._problems("error.json", document)

    def _problems(self, name: str, document: object) -> list[str]:
        # The compiled predicate decides; jsonschema runs only to explain a document already found invalid.
        if self._fast[name](document):
            return []
        return _explain(self._validators[name], document)


def _explain(validator: Validator, document: Any) -> list[str]:
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.path)):
        message = error.message
        if len(message) > _MAX_PROBLEM_CHARS:
            message = message[:_MAX_PROBLEM_CHARS] + "..."
        problems.append(f"{error.json_path}: {message}")
        if len(problems) >= _MAX_PROBLEMS:
            break
    return problems


def _input_semantics(action: str, document: Mapping[str, Any]) -> list[str]:
    """What JSON Schema cannot say: cross-field rules of the inputs the daemon sends (only mutating actions have
    any)."""
    problems = []
    if action in MUTATING and document["tags"]["provisionerd:op"] != document["op_id"]:
        problems.append("$.tags['provisionerd:op']: must equal $.op_id")
    if action == "requestMachines":
        count = document["template"]["machineCount"]
        refs = [b["instanceRef"] for b in document["bootstrap"]]
        if len(refs) != count:
            problems.append(f"$.bootstrap: {len(refs)} entries for machineCount {count} (one per machine)")
        if len(set(refs)) != len(refs):
            problems.append("$.bootstrap: instanceRef values must be unique")
    return problems


@functools.cache
def contract() -> ContractSchemas:
    """The process-wide compiled schemas (built on first use)."""
    return ContractSchemas()
