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
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import referencing
from jsonschema.protocols import Validator

from provisionerd.domain.contract_actions import CONTRACT_ACTIONS
from provisionerd.provider.fastcheck import Compiler, Predicate, UnsupportedSchema
from provisionerd.provider.typedcheck import TypedCompiler
from provisionerd.resources import schema_dir

#: Every action of the contract (``domain.contract_actions``).
ACTIONS = CONTRACT_ACTIONS
#: Actions that change the infrastructure: they carry ``op_id`` and owner tags.
MUTATING = frozenset({"requestMachines", "requestReturnMachines", "stopMachines", "returnLicenses"})

SCHEMA_DIR = schema_dir()  # inside the installed package (provisionerd/resources)
_MAX_PROBLEMS = 10
_MAX_PATH_CHARS = 200
_MAX_RULE_CHARS = 200
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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

    ``output_violations`` returns ``(json path, rule)`` pairs (empty = valid), at most ``_MAX_PROBLEMS``, each
    bounded, made from the schema alone: ``("$.requests[0].machines[3].result", 'enum: must be one of [...]')``.
    No value of the document is repeated (a plugin's value may be a credential). ``input_problems``,
    ``output_problems`` and ``error_problems`` give the same as ``"<json path>: <rule>"`` strings.
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
        self._parsed: dict[str, Predicate] = {}  # outputs as parse_json gives them: the typed check first
        self._encoded: dict[str, Callable[[str], bool]] = {}  # inputs as dump_json wrote them: the typed decode
        compiler = Compiler({d["$id"]: d for d in documents.values()}, {"date-time": is_rfc3339})
        typed = TypedCompiler({d["$id"]: d for d in documents.values()}, compiler)
        for name, document in documents.items():
            cls = jsonschema.validators.validator_for(document)
            if directory != SCHEMA_DIR:
                # Checked against its metaschema once, here: a broken schema file fails at load, not per call. The
                # shipped ones are checked by the tests instead (tests/provider/test_shipped_schemas.py): checking
                # them cost every process that validates a call 0.11 s of CPU at its start.
                cls.check_schema(document)
            validator = cls(document, registry=registry, format_checker=FORMAT_CHECKER)
            self._validators[name] = validator
            try:
                self._fast[name] = compiler.compile(document["$id"])
            except UnsupportedSchema:
                self._fast[name] = validator.is_valid
            self._parsed[name] = self._fast[name]
            try:
                if name.endswith(".output.json"):
                    self._parsed[name] = typed.predicate(document["$id"])
                elif name.endswith(".input.json"):
                    self._encoded[name] = typed.text_predicate(document["$id"])
            except UnsupportedSchema:
                pass  # fastcheck (or jsonschema) alone, as for any document

    def validator(self, name: str) -> Validator:
        return self._validators[name]

    def input_problems(self, action: str, document: object, *, encoded: str | None = None) -> list[str]:
        """``encoded``: the document as ``runtime.dump_json`` wrote it, what the plugin will read. When the type
        derived from the schema decodes that text (``typedcheck``), the schema holds for it; otherwise the
        document is checked as before (fastcheck, jsonschema for the problems)."""
        name = f"{action}.input.json"
        typed = self._encoded.get(name)
        shown = encoded is not None and typed is not None and typed(encoded)
        problems = [] if shown else self._problems(name, document)
        # ``action in MUTATING`` first: the polls, most calls, skip the ABC isinstance check and a call.
        if not problems and action in MUTATING and isinstance(document, Mapping):
            problems = _input_semantics(action, document)
        return problems

    def output_problems(self, action: str, document: object) -> list[str]:
        return [f"{path}: {rule}" for path, rule in self.output_violations(action, document)]

    def output_violations(self, action: str, document: object, *, parsed: bool = False) -> list[tuple[str, str]]:
        """Every ``(json path, rule)`` an output breaks (empty = valid); no value of ``document`` is repeated.
        ``parsed``: the document is as ``runtime.parse_json`` returned it (only dicts, lists and JSON's scalars),
        which lets the check derived as msgspec types (``typedcheck``) decide first."""
        name = f"{action}.output.json"
        if (self._parsed if parsed else self._fast)[name](document):
            return []
        return schema_problems(self._validators[name], document)

    def error_problems(self, document: object) -> list[str]:
        """Problems of a one-shot error document ``{"error": {...}}``."""
        return self._problems("error.json", document)

    def _problems(self, name: str, document: object) -> list[str]:
        # The compiled predicate decides; jsonschema runs only to explain a document already found invalid.
        if self._fast[name](document):
            return []
        return [f"{path}: {rule}" for path, rule in schema_problems(self._validators[name], document)]


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_path(parts: Iterable[str | int]) -> str:
    """``["requests", 0, "machines"]`` -> ``$.requests[0].machines`` (keys that are not identifiers quoted)."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return _bounded(out, _MAX_PATH_CHARS)


def _want(value: object) -> str:
    return _bounded(json.dumps(value, sort_keys=True, default=str), _MAX_RULE_CHARS // 2)


def _rules(error: jsonschema.ValidationError) -> Iterator[tuple[str, str]]:
    """``(path, rule)`` for one jsonschema error, from the schema alone: the rule says what the value should be,
    never what it was (a plugin's value may be a credential). ``required`` and ``additionalProperties`` point at
    the key itself."""
    parts: list[str | int] = list(error.absolute_path)
    validator = "false" if error.validator in (None, "None") else str(error.validator)
    want = error.validator_value
    instance = error.instance
    if validator == "required" and isinstance(instance, Mapping) and isinstance(want, list):
        for key in (k for k in want if isinstance(k, str) and k not in instance):
            yield _json_path([*parts, key]), "required: is missing"
        return
    if validator == "additionalProperties" and isinstance(instance, Mapping) and isinstance(error.schema, Mapping):
        allowed = error.schema.get("properties", {})
        for key in [k for k in instance if k not in allowed][:_MAX_PROBLEMS]:
            yield _json_path([*parts, str(key)]), "additionalProperties: not allowed here"
        return
    yield (
        _json_path(parts),
        _bounded(f"{validator}: {_RULE_TEXT.get(validator, 'fails {want}').format(want=_want(want))}", _MAX_RULE_CHARS),
    )


#: What each keyword asks of a value, in words (``{want}``: the schema's value, JSON).
_RULE_TEXT = {
    "type": "must be of type {want}",
    "enum": "must be one of {want}",
    "const": "must be {want}",
    "pattern": "must match {want}",
    "format": "must be a {want}",
    "minLength": "must have at least {want} characters",
    "maxLength": "must have at most {want} characters",
    "minimum": "must be at least {want}",
    "maximum": "must be at most {want}",
    "exclusiveMinimum": "must be above {want}",
    "exclusiveMaximum": "must be below {want}",
    "minItems": "must have at least {want} items",
    "maxItems": "must have at most {want} items",
    "uniqueItems": "items must be unique",
    "minProperties": "must have at least {want} keys",
    "maxProperties": "must have at most {want} keys",
    "propertyNames": "a key is not a valid name",
    "false": "no value is allowed here",
}


def schema_problems(validator: Validator, document: Any) -> list[tuple[str, str]]:
    """Every ``(json path, rule)`` of ``document`` under ``validator``, at most ``_MAX_PROBLEMS``, in path order.

    A document the compiled check refused but jsonschema finds nothing wrong with (the two disagree: a bug) is
    still refused, as ``("$", "fastcheck: ...")``: never accepted because the explainer was silent."""
    problems: list[tuple[str, str]] = []
    for error in sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]):
        for problem in _rules(error):
            if problem not in problems:
                problems.append(problem)
        if len(problems) >= _MAX_PROBLEMS:
            return problems[:_MAX_PROBLEMS]
    return problems or [("$", "fastcheck: refused by the compiled check (jsonschema found no single rule)")]


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
