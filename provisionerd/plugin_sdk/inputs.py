"""Rules every plugin applies to the contract's inputs before it touches anything.

``asked_template`` is ``requestMachines``' first check: the template must be one the plugin offers, and the count
within its ``maxNumber``; both are ``invalid_request`` (the daemon's ask is wrong), never a partial launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from provisionerd.plugin_sdk.errors import PluginError


class _Offered(Protocol):
    @property
    def max_number(self) -> int: ...


T = TypeVar("T", bound=_Offered)


def asked_template(templates: Mapping[str, T], doc: Mapping[str, Any]) -> tuple[T, int]:
    """``(template, machine count)`` of a ``requestMachines`` input. Raises ``PluginError("invalid_request")``."""
    asked = doc["template"]
    template = templates.get(asked["templateId"])
    if template is None:
        raise PluginError("invalid_request", f"unknown templateId {asked['templateId']!r}")
    count = asked["machineCount"]
    if count > template.max_number:
        why = f"{count} machines of template {asked['templateId']!r} requested; its maxNumber is {template.max_number}"
        raise PluginError("invalid_request", why)
    return template, count
