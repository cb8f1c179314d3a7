"""The plugin's configuration: ``$PRO_CONF_DIR/kubernetes.json``, checked against ``config.schema.json``.

The plugin adopts an existing cluster: the file names the API server and the credentials (a CA file and a bearer
token file, read again for every connection so a rotated ServiceAccount token is picked up; or ``inCluster`` for
the pod's own ServiceAccount), the one namespace it works in, the agent command, and the templates (a pod spec
each: image, cpu and memory requests, node selector, tolerations). The plugin creates nothing but pods and their
Secrets in that namespace.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from provisionerd.plugin_sdk.config import ConfigInvalid, check_schema, config_path, read_json
from provisionerd.plugin_sdk.probes import probe_problem

CONFIG_FILE = "kubernetes.json"
_SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
_MEMORY_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 1 << 10, "Mi": 1 << 20}
_MEMORY_UNITS.update({"Gi": 1 << 30, "Ti": 1 << 40})


def cpu_millis(text: str) -> int:
    """A Kubernetes CPU quantity (``2``, ``0.5``, ``250m``) in millicores."""
    if text.endswith("m"):
        return int(text[:-1])
    return round(float(text) * 1000)


def memory_bytes(text: str) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``1G``, ``1048576``) in bytes."""
    digits = text.rstrip("KMGTi")
    return int(digits) * _MEMORY_UNITS[text[len(digits) :]]


@attrs.frozen
class Template:
    template_id: str
    max_number: int
    image: str
    cpu: str
    memory: str
    node_selector: Mapping[str, str] = attrs.field(factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    type: str = "X86_64"
    attributes: Mapping[str, tuple[str, str]] = attrs.field(factory=dict)
    #: ``{name: shell command}``: the pod's agent runs them and reports what they print (``--probe``); from this
    #: config only, never from a request.
    probes: Mapping[str, str] = attrs.field(factory=dict)
    #: The pod agent's ``--reprobe-interval`` (0 = never); ``None``: the agent's default.
    reprobe_interval: float | None = None

    def as_contract(self, max_number: int | None = None) -> dict[str, Any]:
        attributes: dict[str, list[str]] = {
            "type": ["String", self.type],
            "ncpus": ["Numeric", str(max(1, cpu_millis(self.cpu) // 1000))],
            "mem": ["Numeric", str(memory_bytes(self.memory) >> 20)],
        }
        attributes.update({name: list(value) for name, value in self.attributes.items()})
        return {
            "templateId": self.template_id,
            "maxNumber": self.max_number if max_number is None else max_number,
            "attributes": attributes,
        }


@attrs.frozen
class Config:
    namespace: str
    agent_certs: str
    agent_command: tuple[str, ...]
    agent_extra_args: tuple[str, ...]
    templates: Mapping[str, Template]
    api_server: str | None = None
    ca_file: str | None = None
    token_file: str | None = None
    in_cluster: bool = False
    request_timeout: float = 20.0
    unschedulable_seconds: float = 120.0
    service_account_name: str | None = None
    #: A Secret in the namespace holding the worker's certificates (``ca.pem``, ``cert.pem``, ``key.pem``), mounted
    #: read-only at ``agent_certs`` in every pod (``None``: they are in the image).
    agent_certs_secret: str | None = None
    test_faults: frozenset[str] = frozenset()

    @classmethod
    def from_environment(cls) -> Config:
        """Raises a ``ConfigError`` (``provider_error``) naming the problem."""
        return cls.from_file(config_path(CONFIG_FILE))

    @classmethod
    def from_file(cls, path: Path) -> Config:
        return cls.from_document(read_json(path), path.parent)

    @classmethod
    def from_document(cls, doc: Any, base: Path) -> Config:
        check_schema(json.loads(_SCHEMA_PATH.read_text()), doc, CONFIG_FILE)
        in_cluster = bool(doc.get("inCluster", False))
        if not in_cluster and not (doc.get("apiServer") and doc.get("tokenFile")):
            raise ConfigInvalid(f"{CONFIG_FILE}: apiServer and tokenFile are needed unless inCluster", CONFIG_FILE)
        templates: dict[str, Template] = {}
        for i, t in enumerate(doc["templates"]):
            if t["templateId"] in templates:
                raise ConfigInvalid(f"{CONFIG_FILE}: templateId {t['templateId']!r} twice", CONFIG_FILE)
            problem = probe_problem(t.get("probes", {}), t.get("reprobeInterval"))
            if problem:
                raise ConfigInvalid(f"{CONFIG_FILE}: templates[{i}] ({t['templateId']!r}).{problem}", CONFIG_FILE)
            templates[t["templateId"]] = Template(
                template_id=t["templateId"],
                max_number=t["maxNumber"],
                image=t["image"],
                cpu=t["cpu"],
                memory=t["memory"],
                node_selector=dict(t.get("nodeSelector", {})),
                tolerations=tuple(t.get("tolerations", ())),
                type=t.get("type", "X86_64"),
                attributes={k: (v[0], v[1]) for k, v in t.get("attributes", {}).items()},
                probes=dict(t.get("probes", {})),
                reprobe_interval=None if t.get("reprobeInterval") is None else float(t["reprobeInterval"]),
            )

        def path(key: str) -> str | None:
            value = doc.get(key)
            return None if value is None else str(base / value)

        agent = doc["agent"]
        return cls(
            namespace=doc["namespace"],
            agent_certs=agent["certs"],
            agent_command=tuple(agent.get("command") or (sys.executable, "-m", "provisionerd", "agent")),
            agent_extra_args=tuple(agent.get("extraArgs", ())),
            agent_certs_secret=agent.get("certsSecret"),
            templates=templates,
            api_server=doc.get("apiServer"),
            ca_file=path("caFile"),
            token_file=path("tokenFile"),
            in_cluster=in_cluster,
            request_timeout=float(doc.get("requestTimeout", 20)),
            unschedulable_seconds=float(doc.get("unschedulableSeconds", 120)),
            service_account_name=doc.get("serviceAccountName"),
            test_faults=frozenset(doc.get("testFaults", ())),
        )
