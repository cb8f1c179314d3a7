"""The operator's ``userData`` template for a legacy LSF plugin: the placeholder vocabulary and its checks.

Pure (no I/O, no trio). It lives in ``config`` because the config's own checks (``config.problems``) validate a
``[providers.legacy] user_data`` table with it, and ``config`` sits below ``provider`` in the layers; the legacy
adapter (``provider.legacy``) renders it per request.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

import attrs

from provisionerd.domain.errors import ConfigError

#: Placeholders a userData template may use. ``join_token`` is the secret; it and ``instance_ref`` are per machine.
PLACEHOLDERS = frozenset({"join_token", "instance_ref", "controllers", "cluster", "provider", "op_id", "epoch"})
PER_MACHINE = frozenset({"join_token", "instance_ref"})


@attrs.frozen
class UserDataTemplate:
    """The operator's ``userData`` for a legacy plugin: ``{key: text}`` where a text may hold placeholders such as
    ``{join_token}``. LSF plugins hand ``userData`` to the machine (the AWS plugin exports it as variables in its
    user-data script), so this is how a legacy machine can learn how to join. Nothing secret is sent unless a
    value names ``{join_token}``."""

    values: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, values: Mapping[str, Any], where: str = "userData") -> UserDataTemplate:
        """Validate a template from config; ``ConfigError`` lists every problem."""
        problems = []
        for key, text in values.items():
            if not isinstance(text, str):
                problems.append(f"{where}.{key}: must be a string, not {type(text).__name__}")
                continue
            try:
                fields = [f for _, f, spec, conv in string.Formatter().parse(text) if f is not None]
                specs = [(spec, conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None]
            except ValueError as exc:
                problems.append(f"{where}.{key}: {exc}")
                continue
            for name, (spec, conv) in zip(fields, specs, strict=True):
                if name not in PLACEHOLDERS:
                    problems.append(f"{where}.{key}: unknown placeholder {{{name}}} (known: {sorted(PLACEHOLDERS)})")
                elif spec or conv:
                    problems.append(f"{where}.{key}: placeholder {{{name}}} takes no format spec or conversion")
        if problems:
            raise ConfigError("invalid legacy userData template", problems)
        return cls(dict(values))

    @property
    def per_machine(self) -> bool:
        """Whether a value differs per machine (then each machine needs its own requestMachines call)."""
        return any(self._fields(text) & PER_MACHINE for text in self.values.values())

    @property
    def carries_token(self) -> bool:
        return any("join_token" in self._fields(text) for text in self.values.values())

    def render(self, fields: Mapping[str, str]) -> dict[str, str]:
        return {key: text.format_map(fields) for key, text in self.values.items()}

    @staticmethod
    def _fields(text: str) -> set[str]:
        return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
