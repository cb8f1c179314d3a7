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
from provisionerd.plugin_sdk.probes import probe_problem
from provisionerd.plugin_sdk.values import Template as Offer

CONFIG_FILE = "aws_ec2.json"
_SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
_CREDENTIAL_WORDS = ("secret", "access_key", "accesskey", "session_token", "sessiontoken", "password", "credential")


#: How a template's instance types are tried (README "Several instance types and subnets").
PRIORITIZED, LOWEST_PRICE = "prioritized", "lowest-price"
#: How its machines join: a per-machine token in user-data (one RunInstances per machine), or the address-bound
#: join (no secret in user-data, so one RunInstances launches many: protocol.md §4 "Address-bound join").
JOIN_TOKEN, JOIN_ADDRESS_BOUND = "token", "address-bound"


@attrs.frozen
class InstanceOption:
    """One instance type a template may launch, and what it costs when the config documents that."""

    instance_type: str
    price: Mapping[str, Any] | None = None


@attrs.frozen
class Template:
    template_id: str
    instance_types: tuple[InstanceOption, ...]
    image_id: str
    max_number: int
    attributes: Mapping[str, tuple[str, str]]
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    instance_profile_arn: str | None = None
    market: str = "on-demand"
    extra_tags: Mapping[str, str] = attrs.field(factory=dict)
    price: Mapping[str, Any] | None = None
    allocation_strategy: str = PRIORITIZED
    join: str = JOIN_TOKEN
    #: ``{name: shell command}``: each machine's agent runs them and reports what they print (``--probe``), from
    #: this config only, never from a request (``bootstrap``: the user-data's own part, not the request's).
    probes: Mapping[str, str] = attrs.field(factory=dict)
    #: The agent's ``--reprobe-interval`` (0 = never); ``None``: the agent's default.
    reprobe_interval: float | None = None

    @property
    def offer_price(self) -> Mapping[str, Any] | None:
        """The price the offer states: the template's, or, with a price per type, the dearest type's. A machine
        may land on any listed type, so the offer promises no less than the worst: a cost cap judged on it holds
        whichever type EC2 gives (each machine's own quote is its type's price: :meth:`quote`)."""
        priced = [o.price for o in self.instance_types if o.price is not None]
        if not priced:
            return self.price
        return max(priced, key=lambda p: float(p["amount"]))

    def quote(self, instance_type: str) -> Mapping[str, Any] | None:
        """The price of one machine of ``instance_type`` (the template's price when types have none)."""
        for option in self.instance_types:
            if option.instance_type == instance_type and option.price is not None:
                return option.price
        return self.price

    def as_contract(self) -> dict[str, Any]:
        """The template as ``getAvailableTemplates`` reports it (price only when the config documents one)."""
        return Offer(self.template_id, self.max_number, self.attributes, self.offer_price).to_contract()


@attrs.frozen
class Config:
    region: str
    templates: Mapping[str, Template]
    endpoint_url: str | None = None
    profile: str | None = None
    terminate_batch_size: int = 50
    launch_batch_size: int = 250
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
                f"{err.json_path}: {_explain(err)}"
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

    def quote(self, template_id: str, instance_type: str) -> Mapping[str, Any] | None:
        """The configured price of one machine of ``template_id`` that EC2 launched as ``instance_type``."""
        template = self.templates.get(template_id)
        return template.quote(instance_type) if template is not None else None

    @property
    def has_prices(self) -> bool:
        return any(t.offer_price is not None for t in self.templates.values())


def _template(raw: Mapping[str, Any]) -> Template:
    if "instanceTypes" in raw:
        options = tuple(InstanceOption(o["instanceType"], o.get("price")) for o in raw["instanceTypes"])
    else:
        options = (InstanceOption(raw["instanceType"]),)
    subnets = tuple(raw["subnetIds"]) if "subnetIds" in raw else ((raw["subnetId"],) if "subnetId" in raw else ())
    template = Template(
        template_id=raw["templateId"],
        instance_types=options,
        image_id=raw["imageId"],
        max_number=raw["maxNumber"],
        attributes={name: (value[0], value[1]) for name, value in raw["attributes"].items()},
        subnet_ids=subnets,
        security_group_ids=tuple(raw.get("securityGroupIds", ())),
        key_name=raw.get("keyName"),
        instance_profile_arn=raw.get("instanceProfileArn"),
        market=raw.get("market", "on-demand"),
        extra_tags=dict(raw.get("extraTags", {})),
        price=raw.get("price"),
        allocation_strategy=raw.get("allocationStrategy", PRIORITIZED),
        join=raw.get("join", JOIN_TOKEN),
        probes=dict(sorted(raw.get("probes", {}).items())),
        reprobe_interval=None if raw.get("reprobeInterval") is None else float(raw["reprobeInterval"]),
    )
    problem = _price_problem(template) or probe_problem(template.probes, template.reprobe_interval)
    if problem:
        raise ConfigInvalid(f"invalid aws_ec2 config: template {template.template_id!r}: {problem}", CONFIG_FILE)
    return template


def _price_problem(template: Template) -> str | None:
    """What the schema cannot say about a template's prices: all types priced or none, one currency, and
    ``lowest-price`` only where every type has a price (the plugin invents none)."""
    priced = [o for o in template.instance_types if o.price is not None]
    if priced and len(priced) != len(template.instance_types):
        return "give every instanceTypes entry a price, or none"
    if priced and template.price is not None:
        return "a price per instance type and a template price: give one or the other"
    if len({o.price["currency"] for o in priced if o.price is not None}) > 1:
        return "the instance types' prices are in different currencies"
    if template.allocation_strategy == LOWEST_PRICE and not priced:
        return 'allocationStrategy "lowest-price" needs a price for every instance type'
    return None


def _explain(err: jsonschema.ValidationError) -> str:
    """An error's message; for a rule between keys (one of two keys, not both) the rule's own description, since
    jsonschema's message quotes the whole template and says only that it matched the wrong number of branches."""
    description = err.schema.get("description") if isinstance(err.schema, dict) else None
    if err.validator in ("oneOf", "not") and description:
        return str(description)
    # jsonschema's message would quote the whole value first, and be cut before the rule.
    if err.validator == "maxLength":
        return f"longer than {err.validator_value} characters"
    if err.validator == "maxProperties":
        return f"more than {err.validator_value} entries"
    return err.message[:200]


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
