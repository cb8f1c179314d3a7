"""Checks of action inputs: each returns the plain values an action needs or raises ``invalid_request``.

The daemon validates inputs against ``schemas/`` before calling; the plugin checks again what it relies on, because
it also runs under other callers (LSF, the conformance kit, a human with a JSON file). Messages name fields and
positions, never values of ``joinToken``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from aws_ec2_plugin.bootstrap import TAG_CLUSTER, TAG_EPOCH, TAG_OP, TAG_PROVIDER
from aws_ec2_plugin.config import Config, Template
from aws_ec2_plugin.failures import PluginError

OP_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
CONTROLLER = re.compile(r"^\S{1,290}:[0-9]{1,5}$")
MAX_ITEMS = 10000
OWNER_KEYS = (TAG_CLUSTER, TAG_PROVIDER, TAG_OP, TAG_EPOCH)


@attrs.frozen
class CreateRequest:
    template: Template
    op_id: str
    owner_tags: Mapping[str, str]
    bootstraps: tuple[Mapping[str, Any], ...]
    passthrough: Mapping[str, Any]
    #: ``allOrNothing``: every machine of the request or none (``create``: what a short call launched is terminated).
    all_or_nothing: bool = False


def _bad(message: str) -> PluginError:
    return PluginError("invalid_request", message)


def _object(doc: object, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise _bad(f"{what} must be a JSON object")
    return doc


def owner_tags(doc: Mapping[str, Any], op_id: str, cluster: str | None) -> dict[str, str]:
    """The owner tags of a mutating input: the four keys, op tag equal to op_id, our cluster."""
    tags = _object(doc.get("tags"), "tags")
    if not all(
        isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 128 and len(v) <= 256 for k, v in tags.items()
    ):
        raise _bad("tags must map strings (keys 1-128 chars) to strings (at most 256 chars)")
    missing = [k for k in OWNER_KEYS if not tags.get(k)]
    if missing:
        raise _bad(f"tags lacks {', '.join(missing)}")
    if tags[TAG_OP] != op_id:
        raise _bad("tags['provisionerd:op'] must equal op_id")
    check_cluster(tags[TAG_CLUSTER], cluster)
    return dict(tags)


def check_cluster(value: str, cluster: str | None) -> None:
    if cluster and value != cluster:
        raise _bad(f"cluster tag {value!r} is not this plugin's cluster {cluster!r}")


def op_id_of(doc: Mapping[str, Any]) -> str:
    op_id = doc.get("op_id")
    if not isinstance(op_id, str) or not OP_ID.match(op_id):
        raise _bad("op_id must be 1-64 characters of [A-Za-z0-9._:-]")
    return op_id


def create_request(doc: object, config: Config, cluster: str | None) -> CreateRequest:
    doc = _object(doc, "input")
    template_doc = _object(doc.get("template"), "template")
    template_id = template_doc.get("templateId")
    template = config.templates.get(template_id) if isinstance(template_id, str) else None
    if template is None:
        raise _bad(f"unknown templateId {template_id!r}")
    count = template_doc.get("machineCount")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_ITEMS:
        raise _bad(f"machineCount must be an integer from 1 to {MAX_ITEMS}")
    if count > template.max_number:
        raise _bad(f"machineCount {count} exceeds template {template_id!r} maxNumber {template.max_number}")
    op_id = op_id_of(doc)
    tags = owner_tags(doc, op_id, cluster)
    bootstraps = doc.get("bootstrap")
    if not isinstance(bootstraps, list) or len(bootstraps) != count:
        raise _bad("bootstrap must be a list with one entry per machine (machineCount entries)")
    refs = set()
    for i, entry in enumerate(bootstraps):
        _check_bootstrap(entry, i)
        refs.add(entry["instanceRef"])
    if len(refs) != count:
        raise _bad("bootstrap instanceRefs must be unique")
    passthrough = doc.get("userData", {})
    if not isinstance(passthrough, dict):
        raise _bad("userData must be a JSON object")
    whole = doc.get("allOrNothing", False)
    if not isinstance(whole, bool):
        raise _bad(f"allOrNothing must be a boolean, not {whole!r}")
    return CreateRequest(template, op_id, tags, tuple(bootstraps), passthrough, whole)


def _check_bootstrap(entry: object, i: int) -> None:
    where = f"bootstrap[{i}]"
    if not isinstance(entry, dict):
        raise _bad(f"{where} must be an object")
    ref = entry.get("instanceRef")
    if not isinstance(ref, str) or not 0 < len(ref) <= 256:
        raise _bad(f"{where}.instanceRef must be a string of 1-256 characters")
    controllers = entry.get("controllers")
    if (
        not isinstance(controllers, list)
        or not 1 <= len(controllers) <= 16
        or not all(isinstance(c, str) and CONTROLLER.match(c) for c in controllers)
    ):
        raise _bad(f"{where}.controllers must be 1-16 'host:port' strings")
    token = entry.get("joinToken")
    if not isinstance(token, str) or not 16 <= len(token) <= 512:
        raise _bad(f"{where}.joinToken must be a string of 16-512 characters")  # never echo the value
    for key in ("orphanTimeout", "maxLifetime"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
            raise _bad(f"{where}.{key} must be a positive number of seconds, not {value!r}")


def machine_ids(doc: object, *, required: bool) -> list[str]:
    """The instance ids of ``machines``: unique, in input order."""
    doc = _object(doc, "input")
    machines = doc.get("machines", None if required else [])
    if not isinstance(machines, list) or len(machines) > MAX_ITEMS or (required and not machines):
        raise _bad(f"machines must be a list of 1-{MAX_ITEMS} {{name, machineId}} objects")
    ids: dict[str, None] = {}
    for i, machine in enumerate(machines):
        machine_id = machine.get("machineId") if isinstance(machine, dict) else None
        if not isinstance(machine_id, str) or not INSTANCE_ID.match(machine_id):
            raise _bad(f"machines[{i}].machineId must be an EC2 instance id (i-...)")
        ids[machine_id] = None
    return list(ids)


def request_ids(doc: object) -> list[str]:
    doc = _object(doc, "input")
    requests = doc.get("requests")
    if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_ITEMS:
        raise _bad(f"requests must be a list of 1-{MAX_ITEMS} {{requestId}} objects")
    ids = []
    for i, request in enumerate(requests):
        request_id = request.get("requestId") if isinstance(request, dict) else None
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 1024:
            raise _bad(f"requests[{i}].requestId must be a string of 1-1024 characters")
        ids.append(request_id)
    return ids


def tag_filter(doc: object) -> dict[str, str]:
    """The tags a listing must match. Reading another cluster's machines is allowed; touching them is not."""
    doc = _object(doc, "input")
    tags = _object(doc.get("tags"), "tags")
    if not tags.get(TAG_CLUSTER):
        raise _bad("tags must include provisionerd:cluster: listing is never unscoped")
    if (
        not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 128 and len(v) <= 256 for k, v in tags.items()
        )
        or len(tags) > 40
    ):
        raise _bad("tags must map at most 40 strings to strings")
    return dict(tags)


def paging(doc: object) -> tuple[int, str | None, int | None]:
    """The paging fields of ``listMachines`` (docs/providers.md, "Paging"): ``(skip, token, page_size)``.

    The cursor this plugin hands out is ``"<skip>:<NextToken>"``: EC2's own token of the page to ask for (empty:
    the first), and how many of that page's instances were already given (EC2 answers at least 5 instances a page,
    and more than one reservation's worth may come back, so a page the daemon asked smaller is given in parts)."""
    doc = _object(doc, "input")
    size = doc.get("pageSize")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise _bad("pageSize must be an integer >= 1")
    cursor = doc.get("cursor")
    if cursor is None:
        return 0, None, size
    skip, sep, token = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
    if not sep or not skip.isdigit() or len(cursor) > 4096:
        raise _bad("cursor: not one this plugin gave")
    return int(skip), token or None, size
