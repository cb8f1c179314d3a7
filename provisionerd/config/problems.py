"""Find every problem in a raw config document, each as ``"<path>: <message>"``.

Pure and synchronous. The raw document (what ``tomllib`` returned) is checked against
``schemas/config.schema.json`` first and then for the rules a schema cannot say well (duplicate provider names,
heartbeat timeout above the interval, transport/path combinations). Everything is reported at once, in document
order, so a user fixes a file in one pass.

Provider ``env`` values are credentials: a problem located inside an ``env`` table never repeats the value, nor a key
that is not a valid name (it names the key's position instead: such a key is often a secret pasted in the wrong
place), and no message ever prints a whole table (which could contain one).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jsonschema

from provisionerd import resources
from provisionerd.config.defaults import DEFAULTS  # the one place these defaults live
from provisionerd.config.user_data import UserDataTemplate  # pure: the placeholder vocabulary
from provisionerd.domain.errors import ConfigError

SCHEMA_PATH = resources.config_schema()

#: At most this many problems are listed; a broken file should not produce megabytes of output.
MAX_PROBLEMS = 200
_MAX_MESSAGE = 240
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    # Built once: jsonschema.validate() re-checks the schema on every call (notes/trio-patterns.md). The shipped
    # schema is checked against its metaschema by the tests (tests/provider/test_shipped_schemas.py), not at every
    # start of every process that reads a config (0.05 s of CPU).
    schema = json.loads(resources.require(SCHEMA_PATH).read_text(encoding="utf-8"))
    return jsonschema.validators.validator_for(schema)(schema)


def format_path(parts: Iterable[str | int]) -> str:
    """``["providers", 1, "timeouts", "request"]`` -> ``providers[1].timeouts.request``; ``[]`` -> ``(top level)``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(top level)"


def _is_secret(parts: Sequence[str | int]) -> bool:
    """True for ``providers[i].env`` and anything below it."""
    return len(parts) >= 3 and parts[0] == "providers" and parts[2] == "env"


def _env_key_label(doc: Any, table_path: Sequence[str | int], key: Any) -> str:
    """``key 2 (of 3, in file order; not shown)``: where a bad env key is, without its text."""
    table: Any = doc
    for part in table_path:
        try:
            table = table[part]
        except (KeyError, IndexError, TypeError):
            table = None
            break
    keys = list(table) if isinstance(table, Mapping) else []
    where = f"{keys.index(key) + 1} (of {len(keys)}, in file order" if key in keys else "? (in file order"
    return f"key {where}; not shown: an env key may be a secret by mistake)"


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return "a value"


def _schema_problems(doc: Any) -> Iterator[tuple[list[str | int], str]]:
    for error in _validator().iter_errors(doc):
        parts: list[str | int] = list(error.absolute_path)
        instance = error.instance
        if error.validator == "required":
            missing = re.match(r"^'(.*)' is a required property$", error.message)
            name = missing.group(1) if missing else "?"
            yield parts + [name], "is required but missing"
        elif error.validator == "additionalProperties" and isinstance(instance, Mapping):
            schema = error.schema
            allowed = set(schema.get("properties", {})) if isinstance(schema, Mapping) else set()
            for key in sorted(k for k in instance if k not in allowed):
                yield parts + [key], "unknown key"
        elif "propertyNames" in error.absolute_schema_path:  # a bad key name; instance is the key
            # An env key is not shown either: a key that is not a name is often a secret pasted in the wrong place.
            key = _env_key_label(doc, parts, instance) if _is_secret(parts) else repr(instance)
            yield parts, f"{key} is not a valid name (letters, digits and _; not starting with a digit)"
        elif _is_secret(parts):
            expected = "a table of strings" if len(parts) == 3 else "a string of at most 65536 characters"
            message = f"value hidden: fails the {error.validator!r} check (expected {expected})"
            if len(parts) > 3 and not (isinstance(parts[3], str) and _IDENT.match(parts[3])):
                yield parts[:3], f"the value of {_env_key_label(doc, parts[:3], parts[3])}: {message}"
            else:
                yield parts, message
        else:
            message = error.message
            if isinstance(instance, (Mapping, list)) and instance:  # an empty one holds no secret
                message = message.replace(repr(instance), _kind(instance))
            if len(message) > _MAX_MESSAGE:
                message = message[: _MAX_MESSAGE - 3] + "..."
            yield parts, message


def _get(doc: Any, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping) or key not in doc:
            return default
        doc = doc[key]
    return doc


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _semantic_problems(doc: Any) -> Iterator[tuple[list[str | int], str]]:
    """Rules across fields. Defensive: the document may have failed the schema, so every access is checked."""
    controller = _get(doc, "controller", default={})
    interval = _number(_get(controller, "heartbeat_interval", default=DEFAULTS["heartbeat_interval"]))
    timeout = _number(_get(controller, "heartbeat_timeout", default=DEFAULTS["heartbeat_timeout"]))
    if interval is not None and timeout is not None and interval > 0 and timeout <= interval:
        yield (
            ["controller", "heartbeat_timeout"],
            f"{timeout:g} must be greater than heartbeat_interval ({interval:g}), or every link looks dead",
        )
    initial = _number(_get(controller, "backoff", "initial", default=DEFAULTS["backoff_initial"]))
    maximum = _number(_get(controller, "backoff", "max", default=DEFAULTS["backoff_max"]))
    if initial is not None and maximum is not None and maximum < initial:
        yield ["controller", "backoff", "max"], f"{maximum:g} is less than backoff.initial ({initial:g})"
    addresses = _get(controller, "addresses", default=[])
    if isinstance(addresses, list):
        for i, address in enumerate(addresses):
            port = address.rpartition(":")[2] if isinstance(address, str) else ""
            if port.isdigit() and not 1 <= int(port) <= 65535:
                yield ["controller", "addresses", i], f"port {int(port)} is out of range 1-65535"

    providers = _get(doc, "providers", default=[])
    if not isinstance(providers, list):
        return
    first_seen: dict[str, int] = {}
    for i, provider in enumerate(providers):
        if not isinstance(provider, Mapping):
            continue
        name = provider.get("name")
        if isinstance(name, str):
            if name in first_seen:
                yield ["providers", i, "name"], f"duplicate provider name {name!r} (also providers[{first_seen[name]}])"
            else:
                first_seen[name] = i
        transport = provider.get("transport")
        has_path, has_argv = "path" in provider, "argv" in provider
        if transport == "oneshot":
            if has_argv:
                yield ["providers", i, "argv"], "only a 'persistent' provider takes argv (oneshot uses path)"
            if not has_path:
                yield ["providers", i, "path"], "is required for transport 'oneshot' (the scripts' directory)"
        elif transport == "persistent" and has_path == has_argv:
            yield ["providers", i], "a 'persistent' provider needs exactly one of path or argv"
        yield from _legacy_problems(i, provider)


def _legacy_problems(i: int, provider: Mapping[str, Any]) -> Iterator[tuple[list[str | int], str]]:
    """``[providers.legacy]``: only for a one-shot plugin, and a userData template with known placeholders only."""
    legacy = provider.get("legacy")
    if not isinstance(legacy, Mapping):
        return
    if provider.get("transport") == "persistent" and legacy.get("mode", "auto") is not False:
        yield ["providers", i, "legacy"], "an LSF plugin is one-shot: legacy mode needs transport 'oneshot'"
    user_data = legacy.get("user_data")
    if isinstance(user_data, Mapping) and all(isinstance(v, str) for v in user_data.values()):
        try:
            UserDataTemplate.parse(user_data, "user_data")
        except ConfigError as exc:
            for problem in exc.problems:
                key, _, message = problem.partition(": ")
                yield ["providers", i, "legacy", *key.split(".")], message


def find_problems(doc: Any) -> list[str]:
    """Every problem in ``doc`` as ``"<path>: <message>"``, in document order; empty when the document is valid."""
    found = list(_schema_problems(doc)) + list(_semantic_problems(doc))
    found.sort(key=lambda item: _sort_key(item[0]))
    problems: list[str] = []
    seen: set[str] = set()
    for parts, message in found:
        line = f"{format_path(parts)}: {message}"
        if line not in seen:
            seen.add(line)
            problems.append(line)
    if len(problems) > MAX_PROBLEMS:
        extra = len(problems) - MAX_PROBLEMS
        problems = problems[:MAX_PROBLEMS] + [f"(top level): ... and {extra} more problems"]
    return problems


def _sort_key(parts: Sequence[str | int]) -> tuple[tuple[int, str, int], ...]:
    # ints sort numerically and before keys at the same depth, so providers[2] precedes providers[10].
    return tuple((0, "", p) if isinstance(p, int) else (1, p, 0) for p in parts)


def without_refused(doc: Any, rounds: int = 20) -> tuple[Any, list[str]] | None:
    """``doc`` with every value the schema refuses left out, and the paths left out (``format_path``), so the
    checks after the document's (``config.proofs``) can still run on the rest: an unknown key, a value of the wrong
    type or range (its default then applies). ``None`` when that cannot give a valid document (a required key is
    missing or refused, the top level itself is wrong): what comes after the document cannot be checked.

    Used by ``provisionerd config check`` only; a config with any problem never runs."""
    doc = copy.deepcopy(doc)
    removed: list[str] = []
    for _ in range(rounds):
        errors = list(_validator().iter_errors(doc))
        if not errors:
            return doc, removed
        for error in errors:
            parts = list(error.absolute_path)
            if error.validator == "required" or not parts and error.validator != "additionalProperties":
                return None
            if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
                schema = error.schema
                allowed = set(schema.get("properties", {})) if isinstance(schema, Mapping) else set()
                targets = [parts + [key] for key in error.instance if key not in allowed]
            else:
                targets = [parts]
            for target in targets:
                if _remove(doc, target):
                    removed.append(format_path(target))
                else:
                    return None  # a list item (never shifted: other problems name indexes) or a value gone already
    return None


def _remove(doc: Any, parts: Sequence[str | int]) -> bool:
    """Delete the value at ``parts`` (a list item is left out of its list); whether anything was there."""
    *parents, last = parts
    holder = doc
    for part in parents:
        try:
            holder = holder[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(holder, dict) and last in holder:
        del holder[last]
        return True
    return False
