"""The plugin's configuration: ``$PRO_CONF_DIR/slurm.json``, checked against ``config.schema.json``.

The plugin adopts an existing cluster: the file names the partition (and optionally account and QOS) to submit to,
a workdir shared with the compute nodes, the agent command and its certificates, and the templates. Nothing here is
created by the plugin except two subdirectories of the workdir (``tokens/``, mode 0700, and ``logs/``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from provisionerd.plugin_sdk.config import ConfigInvalid, check_schema, config_path, read_json
from provisionerd.plugin_sdk.probes import probe_problem
from provisionerd.plugin_sdk.values import Template as Offer
from provisionerd.provider.schemas import is_rfc3339

CONFIG_FILE = "slurm.json"
_SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
#: sbatch options the plugin sets itself; a template may not override them (the comment carries our tags, the
#: output and export settings keep the token and the plugin's environment out of the job).
_RESERVED = (
    "--comment",
    "--job-name",
    "--export",
    "--export-file",
    "--output",
    "--error",
    "--input",
    "--parsable",
    "--wrap",
    "--chdir",
    "--partition",
    "--account",
    "--qos",
    "--array",
    "--requeue",
    "--no-requeue",
    "--get-user-env",
)


@attrs.frozen
class Template:
    template_id: str
    max_number: int
    cpus: int
    mem_mb: int | None = None
    gres: str | None = None
    time_limit: str | None = None
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()
    attributes: Mapping[str, tuple[str, str]] = attrs.field(factory=dict)
    price: Mapping[str, Any] | None = None
    #: ``{name: shell command}``: the pilot's agent runs them and reports what they print (``--probe``); from this
    #: config only, never from a request.
    probes: Mapping[str, str] = attrs.field(factory=dict)
    #: The pilot agent's ``--reprobe-interval`` (0 = never); ``None``: the agent's default.
    reprobe_interval: float | None = None

    def agent_args(self) -> list[str]:
        """The agent arguments of this template's probes: one ``--probe=NAME=COMMAND`` each (one argument, so a
        name or command that starts with ``-`` stays a value), and ``--reprobe-interval``."""
        args = [f"--probe={name}={command}" for name, command in sorted(self.probes.items())]
        if self.reprobe_interval is not None:
            args += ["--reprobe-interval", f"{self.reprobe_interval:g}"]
        return args

    def resource_args(self) -> list[str]:
        args = ["--nodes=1", "--ntasks=1", f"--cpus-per-task={self.cpus}"]
        if self.mem_mb is not None:
            args.append(f"--mem={self.mem_mb}")
        if self.gres:
            args.append(f"--gres={self.gres}")
        if self.time_limit:
            args.append(f"--time={self.time_limit}")
        if self.constraint:
            args.append(f"--constraint={self.constraint}")
        return [*args, *self.sbatch_args]

    def as_contract(self) -> dict[str, Any]:
        return Offer(self.template_id, self.max_number, self.attributes, self.price).to_contract()


@attrs.frozen
class Config:
    partition: str
    workdir: Path
    certs: str
    agent_command: tuple[str, ...]
    templates: Mapping[str, Template]
    account: str | None = None
    qos: str | None = None
    agent_extra_args: tuple[str, ...] = ()
    slurm_conf: str | None = None
    slurm_bin_dir: str | None = None
    command_timeout: float = 20.0
    accounting: str = "sacct"
    reclaim_notice: int = 300
    export: str = "NONE"

    @classmethod
    def from_file(cls, path: Path) -> Config:
        """Read and check the file. Raises a ``ConfigError`` (``provider_error``) naming the problem."""
        return cls.from_document(read_json(path), str(path))

    @classmethod
    def from_document(cls, doc: Any, where: str = CONFIG_FILE) -> Config:
        check_schema(_schema(), doc, where, {"date-time": is_rfc3339})  # jsonschema alone does not check date-time
        templates: dict[str, Template] = {}
        for i, t in enumerate(doc["templates"]):
            if t["templateId"] in templates:
                raise ConfigInvalid(f"{where}: templates[{i}]: duplicate templateId {t['templateId']!r}", where)
            reserved = [a for a in t.get("sbatchArgs", ()) if a.split("=", 1)[0] in _RESERVED]
            if reserved:
                raise ConfigInvalid(f"{where}: templates[{i}].sbatchArgs: the plugin sets {reserved} itself", where)
            problem = probe_problem(t.get("probes", {}), t.get("reprobeInterval"))
            if problem:
                raise ConfigInvalid(f"{where}: templates[{i}] ({t['templateId']!r}).{problem}", where)
            templates[t["templateId"]] = _template(t)
        agent = doc["agent"]
        default_agent = (os.environ.get("PROVISIONERD_PYTHON") or sys.executable, "-m", "provisionerd", "agent")
        return cls(
            partition=doc["partition"],
            workdir=Path(doc["workdir"]),
            certs=agent["certs"],
            agent_command=tuple(agent.get("command") or default_agent),
            agent_extra_args=tuple(agent.get("extraArgs", ())),
            templates=templates,
            account=doc.get("account"),
            qos=doc.get("qos"),
            slurm_conf=doc.get("slurmConf"),
            slurm_bin_dir=doc.get("slurmBinDir"),
            command_timeout=float(doc.get("commandTimeout", 20.0)),
            accounting=doc.get("accounting", "sacct"),
            reclaim_notice=int(doc.get("reclaimNoticeSeconds", 300)),
            export=doc.get("export", "NONE"),
        )

    @classmethod
    def from_environment(cls) -> Config:
        return cls.from_file(config_path(CONFIG_FILE))


def _template(t: Mapping[str, Any]) -> Template:
    gpus = 0
    for part in (t.get("gres") or "").split(","):
        fields = part.split(":")
        if fields[0] == "gpu":
            gpus += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    attributes: dict[str, tuple[str, str]] = {
        "type": ("String", t.get("type", "X86_64")),
        "ncpus": ("Numeric", str(t["cpus"])),
        "ngpus": ("Numeric", str(gpus)),
    }
    if "memMB" in t:
        attributes["mem"] = ("Numeric", str(t["memMB"]))
    attributes.update({k: (v[0], v[1]) for k, v in t.get("attributes", {}).items()})
    return Template(
        template_id=t["templateId"],
        max_number=t["maxNumber"],
        cpus=t["cpus"],
        mem_mb=t.get("memMB"),
        gres=t.get("gres"),
        time_limit=t.get("timeLimit"),
        constraint=t.get("constraint"),
        sbatch_args=tuple(t.get("sbatchArgs", ())),
        attributes=attributes,
        price=t.get("price"),
        probes=dict(t.get("probes", {})),
        reprobe_interval=None if t.get("reprobeInterval") is None else float(t["reprobeInterval"]),
    )


@functools.cache
def _schema() -> dict[str, Any]:
    return json.loads(_SCHEMA_PATH.read_text())
