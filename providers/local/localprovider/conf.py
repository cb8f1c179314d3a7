"""``$PRO_CONF_DIR/local.json``: the templates on offer and how agents are started.

    {
      "templates": [{"templateId": "local-1", "maxNumber": 64, "ncpus": "auto", "memMb": "auto", "ngpus": 0,
                     "type": "auto", "price": 0}],
      "certsDir": "",            agents' --certs: absolute, or relative to PRO_CONF_DIR; "" = $PRO_DATA_DIR/certs
      "heartbeatSeconds": 5,     agents' --heartbeat
      "replyTimeoutSeconds": 15, agents' --reply-timeout
      "killGraceSeconds": 10,    SIGTERM to SIGKILL when a returned agent does not exit
      "agentCommand": []         argv prefix; [] = [this Python, "-m", "provisionerd", "agent"]
    }

Every key is optional (no file at all = these defaults). ``"auto"`` takes the value from this host. ``price`` is
per machine-hour in USD with source ``"local"``; leave it out (or ``null``) for no price quote. A bad file is a
``provider_error`` naming the problem.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.config import ConfigInvalid, read_json
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.probes import probe_problem

DEFAULT_TEMPLATE = {
    "templateId": "local-1",
    "maxNumber": 64,
    "ncpus": "auto",
    "memMb": "auto",
    "ngpus": 0,
    "type": "auto",
    "price": 0,
}
KEYS = {"templates", "certsDir", "heartbeatSeconds", "replyTimeoutSeconds", "killGraceSeconds", "agentCommand"}
TEMPLATE_KEYS = {
    "templateId", "maxNumber", "ncpus", "memMb", "ngpus", "type", "price", "probes", "reportHost", "reprobeInterval"
}  # fmt: skip


@dataclass(frozen=True)
class Template:
    template_id: str
    max_number: int
    ncpus: int
    mem_mb: int
    ngpus: int
    arch: str
    price: float | None
    #: ``{name: shell command}``: each agent of the template runs them at start and reports what they print
    #: (``provisionerd agent --probe``), e.g. ``{"ngpus": "nvidia-smi -L | wc -l"}``; the daemon checks the report
    #: against the template's attributes. A probe that reports less than the template declares makes a machine
    #: the daemon returns (how the tests make a bad machine on purpose: ``"ngpus": 1`` with ``"echo 0"``).
    probes: tuple[tuple[str, str], ...] = ()
    #: The agents report this host's ncpus, mem, type and ngpus (the agent's default), which the daemon checks
    #: against the template; ``"reportHost": false`` turns that off (``--no-report-host``: the template then plays a
    #: machine of a nominal size, and the daemon's ``unverified_templates`` should name it).
    report_host: bool = True
    #: Seconds between the agents' re-probes after their join (``--reprobe-interval``: 0 = never, else 10 to
    #: 86400); ``None``: the agent's default (300).
    reprobe_interval: float | None = None

    def document(self, available: int) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "templateId": self.template_id,
            "maxNumber": available,
            "attributes": {
                "type": ["String", self.arch],
                "ncpus": ["Numeric", str(self.ncpus)],
                "mem": ["Numeric", str(self.mem_mb)],
                "ngpus": ["Numeric", str(self.ngpus)],
            },
        }
        if self.price is not None:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            doc["price"] = {
                "amount": self.price,
                "currency": "USD",
                "unit": "hour",
                "source": "local",
                "timestamp": stamp,
            }
        return doc


@dataclass(frozen=True)
class Conf:
    templates: tuple[Template, ...]
    certs_dir: str
    heartbeat: float = 5.0
    reply_timeout: float = 15.0
    kill_grace: float = 10.0
    agent_command: tuple[str, ...] = field(default=())

    def template(self, template_id: str) -> Template | None:
        return next((t for t in self.templates if t.template_id == template_id), None)


def _host_cpus() -> int:
    """The CPUs this host's agents may run on, as they report them (``provisionerd.agent.capabilities``): a
    cpuset narrower than the machine's counts, or every machine of an ``"auto"`` template would fall short."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _host_mem_mb() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20))


def _int(doc: dict[str, Any], key: str, where: str, auto: int | None = None, default: int = 0) -> int:
    value = doc.get(key, default)
    if value == "auto" and auto is not None:
        return auto
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PluginError("provider_error", f"local.json {where}.{key}: expected an integer >= 0, got {value!r}")
    return value


def _number(doc: dict[str, Any], key: str, default: float, minimum: float = 0.0) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= minimum:
        raise PluginError("provider_error", f"local.json {key}: expected a number > {minimum:g}, got {value!r}")
    return float(value)


def _reprobe_interval(doc: dict[str, Any], where: str) -> float | None:
    value = doc.get("reprobeInterval")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PluginError("provider_error", f"local.json {where}.reprobeInterval: expected a number, got {value!r}")
    return float(value)  # its bounds: plugin_sdk.probes


def _template(doc: Any, index: int) -> Template:
    where = f"templates[{index}]"
    if not isinstance(doc, dict) or not isinstance(doc.get("templateId"), str) or not doc["templateId"]:
        raise PluginError("provider_error", f"local.json {where}: needs a non-empty templateId")
    unknown = set(doc) - TEMPLATE_KEYS
    if unknown:
        raise PluginError("provider_error", f"local.json {where}: unknown keys {sorted(unknown)}")
    arch = doc.get("type", "auto")
    if not isinstance(arch, str) or not arch:
        raise PluginError("provider_error", f"local.json {where}.type: expected a string")
    price = doc.get("price")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0):
        raise PluginError("provider_error", f"local.json {where}.price: expected a number >= 0 or null")
    probes = doc.get("probes", {})
    if not isinstance(probes, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in probes.items()
    ):
        raise PluginError("provider_error", f"local.json {where}.probes: expected names -> commands")
    problem = probe_problem(probes, _reprobe_interval(doc, where))
    if problem is not None:
        raise PluginError("provider_error", f"local.json {where}.{problem}")
    return Template(
        template_id=doc["templateId"],
        probes=tuple(sorted(probes.items())),
        report_host=doc.get("reportHost") is not False,
        reprobe_interval=_reprobe_interval(doc, where),
        max_number=_int(doc, "maxNumber", where, default=64),
        ncpus=_int(doc, "ncpus", where, auto=_host_cpus(), default=1),
        mem_mb=_int(doc, "memMb", where, auto=_host_mem_mb(), default=1024),
        ngpus=_int(doc, "ngpus", where),
        arch=platform.machine().upper() if arch == "auto" else arch,
        price=None if price is None else float(price),
    )


def load(conf_dir: str, data_dir: str) -> Conf:
    """The configuration from ``conf_dir/local.json`` (defaults when there is none)."""
    doc: dict[str, Any] = {}
    path = Path(conf_dir) / "local.json" if conf_dir else None
    if path is not None and path.is_file():
        doc = read_json(path)
        if not isinstance(doc, dict):
            raise ConfigInvalid(f"{path}: expected a JSON object", path)
    unknown = set(doc) - KEYS
    if unknown:
        raise PluginError("provider_error", f"local.json: unknown keys {sorted(unknown)}")
    raw_templates = doc.get("templates", [DEFAULT_TEMPLATE])
    if not isinstance(raw_templates, list):
        raise PluginError("provider_error", "local.json templates: expected a list")
    templates = tuple(_template(t, i) for i, t in enumerate(raw_templates))
    if len({t.template_id for t in templates}) != len(templates):
        raise PluginError("provider_error", "local.json templates: templateIds must be unique")
    certs = doc.get("certsDir", "")
    if not isinstance(certs, str):
        raise PluginError("provider_error", "local.json certsDir: expected a string")
    if not certs:
        certs = str(Path(data_dir) / "certs")
    elif not Path(certs).is_absolute():
        certs = str(Path(conf_dir or ".") / certs)
    command = doc.get("agentCommand", [])
    if not isinstance(command, list) or not all(isinstance(part, str) and part for part in command):
        raise PluginError("provider_error", "local.json agentCommand: expected a list of non-empty strings")
    heartbeat = _number(doc, "heartbeatSeconds", 5.0)
    reply_timeout = _number(doc, "replyTimeoutSeconds", max(15.0, 3 * heartbeat))
    if reply_timeout < 2 * heartbeat:
        raise PluginError("provider_error", "local.json: replyTimeoutSeconds must be at least 2 x heartbeatSeconds")
    return Conf(
        templates=templates,
        certs_dir=str(Path(certs).resolve()),
        heartbeat=heartbeat,
        reply_timeout=reply_timeout,
        kill_grace=_number(doc, "killGraceSeconds", 10.0),
        agent_command=tuple(command) or (sys.executable, "-m", "provisionerd", "agent"),
    )
