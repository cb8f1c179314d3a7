"""Where the files provisionerd needs at run time are: inside this installed package, found with
``importlib.resources`` (never relative to a checkout).

This package holds links into the source tree, so a checkout keeps the paths that the docs, the tests and
plugin authors use, and a wheel carries a copy of each (package data, executable bits kept)::

    schemas   -> ../../schemas     the provider contract's JSON Schemas and the config's (config.schema.json)
    protocol  -> ../../protocol    the wire schema (provisioner.capnp)
    providers -> ../../providers   the shipped provider plugins (PLUGINS)
    contrib   -> ../../contrib     the systemd unit (systemd_unit)
    example-config.toml -> ../../docs/example-config.toml   the commented example config (example_config)

An editable install (``pip install -e .``) and an uninstalled checkout read the linked directories (the paths
returned are resolved: ``<checkout>/providers/local``); an installed wheel reads its copies. The lowest layer:
standard library only, so ``wire``, ``config`` and ``provider`` may import it. Nothing is checked at import time;
a missing file is reported where it is read.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: The shipped provider plugins: name (their directory under ``providers/`` in the source tree) -> what it is.
PLUGINS: dict[str, str] = {
    "local": "worker agents as processes on this host (the demo's provider); persistent or one-shot",
    "simulated": "a simulated cloud with scripted faults, for tests and trials; persistent or one-shot",
    "aws_ec2": "Amazon EC2 instances (needs the aws extra: boto3); persistent or one-shot",
    "slurm": "nodes of a Slurm cluster, as batch jobs; persistent or one-shot",
    "kubernetes": "pilot pods in a namespace of a Kubernetes cluster (needs the kubernetes extra); persistent",
    "examples/bash": "the contract in bash, one script per action; one-shot",
    "examples/node": "the contract in Node.js; persistent",
    "examples/python": "a third-party Python plugin on the plugin SDK alone; persistent or one-shot",
    "examples/lsf_legacy": "an LSF resource-connector plugin as-is (the legacy contract); one-shot",
}


class ResourceMissing(FileNotFoundError):
    """A file provisionerd ships is not where the installed package says it is (an incomplete install)."""


class UnknownPlugin(LookupError):
    """``plugin_dir`` was asked for a plugin that is not shipped; ``known`` lists the names that are."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no shipped provider plugin named {name!r} (known: {', '.join(sorted(PLUGINS))})")
        self.name = name
        self.known = tuple(sorted(PLUGINS))


def root() -> Path:
    """The directory of this package as installed. Plugins are executed and schemas handed to libraries by path,
    so the package must be files on disk (not inside a zip)."""
    traversable = resources.files(__name__)
    if not isinstance(traversable, Path):
        raise ResourceMissing(f"provisionerd must be installed as files on disk, not from {traversable!r}")
    return traversable


def schema_dir() -> Path:
    """The provider contract's schemas: ``<action>.input.json``, ``<action>.output.json``, ``defs.json``,
    ``error.json``."""
    return (root() / "schemas").resolve()


def config_schema() -> Path:
    """The daemon config's JSON Schema."""
    return schema_dir() / "config.schema.json"


def wire_schema() -> Path:
    """The wire protocol's Cap'n Proto schema."""
    return (root() / "protocol" / "provisioner.capnp").resolve()


def plugin_dir(name: str) -> Path:
    """The directory of the shipped plugin ``name`` (a key of ``PLUGINS``): for a persistent plugin its executable
    is ``provider`` there, for a one-shot one the ``<action>.sh`` scripts are. ``UnknownPlugin`` for any other
    name; whether the install holds it is for the caller to check (``require`` on the file it runs)."""
    if name not in PLUGINS:
        raise UnknownPlugin(name)
    return (root() / "providers" / name).resolve()


def systemd_unit() -> Path:
    """The systemd unit, ``provisionerd.service`` (docs/operations.md, "Install"), to copy into /etc/systemd/system."""
    return (root() / "contrib" / "systemd" / "provisionerd.service").resolve()


def example_config() -> Path:
    """The commented example config (every key, its default or an example); its relative paths are examples."""
    return (root() / "example-config.toml").resolve()


def require(path: Path) -> Path:
    """``path`` when it is a file; ``ResourceMissing`` naming it otherwise."""
    if not path.is_file():
        raise ResourceMissing(f"{path} is missing: the provisionerd install is incomplete")
    return path
