"""The contract's documents as frozen attrs values: build them in a plugin, ``to_contract()`` them into answers.

Field names are Python's; ``to_contract()`` gives the contract's JSON (``schemas/defs.json``), leaving out optional
fields that are unset. Values are checked where the contract has a closed set (a machine's ``result``, a request's
``status``, an attribute's type); the daemon checks every answer against the schemas anyway. Needs ``attrs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

ATTRIBUTE_TYPES = ("String", "Numeric", "Boolean")
MACHINE_RESULTS = ("executing", "succeed", "fail")
REQUEST_STATUSES = ("running", "complete", "complete_with_error")
OWNER_TAGS = ("provisionerd:cluster", "provisionerd:provider", "provisionerd:op", "provisionerd:epoch")
INSTANCE_TAG = "provisionerd:instance"


def _attributes(value: Mapping[str, tuple[str, str]]) -> Mapping[str, tuple[str, str]]:
    pairs = {name: (str(pair[0]), str(pair[1])) for name, pair in value.items()}
    for name, (kind, _) in pairs.items():
        if kind not in ATTRIBUTE_TYPES:
            raise ValueError(f"attribute {name!r}: type {kind!r} is not one of {ATTRIBUTE_TYPES}")
    return pairs


def _optional(doc: dict[str, Any], **fields: Any) -> dict[str, Any]:
    doc.update({key: value for key, value in fields.items() if value is not None})
    return doc


@attrs.frozen
class Price:
    """A price quote per machine and hour (ext)."""

    amount: float
    currency: str
    source: str
    timestamp: str  # RFC 3339
    unit: str = "hour"

    def to_contract(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Template:
    """A template on offer (``getAvailableTemplates``): ``attributes`` maps a name to ``(type, value)``."""

    template_id: str
    max_number: int
    attributes: Mapping[str, tuple[str, str]] = attrs.field(factory=dict, converter=_attributes)
    price: Price | Mapping[str, Any] | None = None

    def to_contract(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "templateId": self.template_id,
            "maxNumber": self.max_number,
            "attributes": {name: list(pair) for name, pair in self.attributes.items()},
        }
        if isinstance(self.price, Price):
            doc["price"] = self.price.to_contract()
        elif self.price is not None:
            doc["price"] = dict(self.price)
        return doc


@attrs.frozen
class Bootstrap:
    """What one new machine needs to join (``requestMachines`` input). ``join_token`` is a secret: not in repr."""

    instance_ref: str
    controllers: tuple[str, ...]
    join_token: str = attrs.field(repr=False)

    @classmethod
    def from_contract(cls, doc: Mapping[str, Any]) -> Bootstrap:
        return cls(doc["instanceRef"], tuple(doc["controllers"]), doc["joinToken"])


@attrs.frozen
class Machine:
    """A machine as ``getRequestStatus`` reports it (``result``) and ``listMachines`` lists it (``status``)."""

    machine_id: str
    name: str
    result: str = attrs.field(default="executing", validator=attrs.validators.in_(MACHINE_RESULTS))
    status: str = "running"
    launchtime: int = 0
    private_ip: str | None = None
    instance_ref: str | None = None
    message: str | None = None
    tags: Mapping[str, str] = attrs.field(factory=dict)

    def status_entry(self) -> dict[str, Any]:
        """The ``getRequestStatus`` machine entry; ``instanceRef`` defaults to the ``provisionerd:instance`` tag."""
        doc = {"machineId": self.machine_id, "name": self.name, "result": self.result, "status": self.status}
        doc = _optional(doc, instanceRef=self.instance_ref or self.tags.get(INSTANCE_TAG), message=self.message)
        return {**doc, "launchtime": self.launchtime, "privateIpAddress": self.private_ip, "tags": dict(self.tags)}

    def listing_entry(self) -> dict[str, Any]:
        """The ``listMachines`` entry."""
        return {
            "machineId": self.machine_id,
            "name": self.name,
            "status": self.status,
            "launchtime": self.launchtime,
            "privateIpAddress": self.private_ip,
            "tags": dict(self.tags),
        }


@attrs.frozen
class RequestStatus:
    """One request's status (``getRequestStatus``)."""

    request_id: str
    status: str = attrs.field(validator=attrs.validators.in_(REQUEST_STATUSES))
    machines: tuple[Machine, ...] = ()
    message: str | None = None

    def to_contract(self) -> dict[str, Any]:
        doc = {"requestId": self.request_id, "status": self.status}
        return _optional({**doc, "machines": [m.status_entry() for m in self.machines]}, message=self.message)


def owner_tags(doc: Mapping[str, Any]) -> dict[str, str]:
    """The owner tags of a mutating input (``doc["tags"]``), to put on every machine it creates."""
    tags = doc.get("tags") or {}
    return {str(key): str(value) for key, value in tags.items()}


def matches(tags: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Whether ``tags`` carries every key of ``wanted`` with the same value (a ``listMachines`` tag filter)."""
    return all(tags.get(key) == value for key, value in wanted.items())
