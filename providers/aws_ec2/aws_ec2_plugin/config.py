"""The plugin's configuration: ``$PRO_CONF_DIR/aws_ec2.json``, checked against ``config.schema.json``.

Credentials are never part of it: boto3 resolves them through the standard AWS chain (environment, shared
credentials/config files, SSO, container or instance role). A credential-like key is refused by name with a message
saying where credentials belong, because the daemon may log or copy this file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import jsonschema

from provisionerd.plugin_sdk.config import ConfigInvalid, load_config
from provisionerd.plugin_sdk.values import Template as Offer

CONFIG_FILE = "aws_ec2.json"
_SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
_CREDENTIAL_WORDS = ("secret", "access_key", "accesskey", "session_token", "sessiontoken", "password", "credential")


@attrs.frozen
class Template:
    template_id: str
    instance_type: str
    image_id: str
    max_number: int
    attributes: Mapping[str, tuple[str, str]]
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    instance_profile_arn: str | None = None
    market: str = "on-demand"
    extra_tags: Mapping[str, str] = attrs.field(factory=dict)
    price: Mapping[str, Any] | None = None

    def as_contract(self) -> dict[str, Any]:
        """The template as ``getAvailableTemplates`` reports it (price only when the config documents one)."""
        return Offer(self.template_id, self.max_number, self.attributes, self.price).to_contract()


@attrs.frozen
class Config:
    region: str
    templates: Mapping[str, Template]
    endpoint_url: str | None = None
    profile: str | None = None
    terminate_batch_size: int = 50
    describe_batch_size: int = 200
    max_attempts: int = 3
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    visibility_grace: float = 300.0
    reclaim_tag: str = "provisionerd:reclaim"
    reclaim_grace_period: int = 120
    fault_injection: Mapping[str, Any] | None = None

    @classmethod
    def from_document(cls, doc: object) -> Config:
        """Validate a parsed config document; every problem is listed with its JSON path."""
        problems = _credential_keys(doc, "$")
        if not problems:
            validator = _validator()
            problems = [
                f"{err.json_path}: {err.message[:200]}"
                for err in sorted(validator.iter_errors(doc), key=lambda e: e.json_path)
            ]
        if problems:
            raise ConfigInvalid("invalid aws_ec2 config: " + "; ".join(problems[:10]), CONFIG_FILE, tuple(problems))
        assert isinstance(doc, dict)
        templates: dict[str, Template] = {}
        for raw in doc["templates"]:
            if raw["templateId"] in templates:
                raise ConfigInvalid(f"invalid aws_ec2 config: duplicate templateId {raw['templateId']!r}", CONFIG_FILE)
            templates[raw["templateId"]] = _template(raw)
        plain = {k: v for k, v in doc.items() if k != "templates"}
        return cls(templates=templates, **plain)

    @classmethod
    def from_conf_dir(cls, conf_dir: str | None = None) -> Config:
        """``<conf_dir or $PRO_CONF_DIR>/aws_ec2.json``. Raises a ``ConfigError`` (``provider_error``)."""
        environ = None if conf_dir is None else {"PRO_CONF_DIR": conf_dir}
        doc, _ = load_config(CONFIG_FILE, environ)
        return cls.from_document(doc)

    @property
    def has_prices(self) -> bool:
        return any(t.price is not None for t in self.templates.values())


def _template(raw: Mapping[str, Any]) -> Template:
    return Template(
        template_id=raw["templateId"],
        instance_type=raw["instanceType"],
        image_id=raw["imageId"],
        max_number=raw["maxNumber"],
        attributes={name: (value[0], value[1]) for name, value in raw["attributes"].items()},
        subnet_id=raw.get("subnetId"),
        security_group_ids=tuple(raw.get("securityGroupIds", ())),
        key_name=raw.get("keyName"),
        instance_profile_arn=raw.get("instanceProfileArn"),
        market=raw.get("market", "on-demand"),
        extra_tags=dict(raw.get("extraTags", {})),
        price=raw.get("price"),
    )


def _credential_keys(doc: object, path: str) -> list[str]:
    """Paths of keys that look like credentials, anywhere in the document."""
    found: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            lowered = str(key).lower().replace("-", "_")
            if any(word in lowered for word in _CREDENTIAL_WORDS):
                found.append(
                    f"{path}.{key}: credentials do not belong in this file; use the AWS environment variables, "
                    'shared credentials/config files ("profile"), SSO or an instance role'
                )
            found += _credential_keys(value, f"{path}.{key}")
    elif isinstance(doc, list):
        for i, item in enumerate(doc):
            found += _credential_keys(item, f"{path}[{i}]")
    return found


_VALIDATOR: jsonschema.protocols.Validator | None = None


def _validator() -> jsonschema.protocols.Validator:
    global _VALIDATOR
    if _VALIDATOR is None:
        schema = json.loads(_SCHEMA_PATH.read_text())
        _VALIDATOR = jsonschema.validators.validator_for(schema)(schema)
    return _VALIDATOR
