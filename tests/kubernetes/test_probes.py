"""A template's capability probes (issue 35, item 1), in process: the config checks them, each pod's container
command passes them to its agent (one ``--probe=NAME=COMMAND`` entry each), written so that Kubernetes' own
``$(VAR)`` expansion of a container's command gives them back as configured, and a request cannot add one."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

PLUGIN = Path(__file__).resolve().parents[2] / "providers" / "kubernetes"
sys.path.insert(0, str(PLUGIN))

from k8s_plugin.config import Config  # noqa: E402
from k8s_plugin.pods import ENTRY, literal, pod_manifest  # noqa: E402

from provisionerd.agent import capabilities  # noqa: E402
from provisionerd.plugin_sdk.config import ConfigInvalid  # noqa: E402
from provisionerd.plugin_sdk.errors import PluginError  # noqa: E402

PROBES = {
    "gputype": "nvidia-smi --query-gpu=name --format=csv,noheader | head -1",
    "odd": """ echo 'it''s' "$HOME" $(POD_NAME) $(touch /tmp/x) $$ `id` a\\b * ; echo $""",
}
BOOT = {"instanceRef": "c1/i-1", "controllers": ["ctl:7443"], "joinToken": "never-in-the-spec"}


def document(**template: Any) -> dict[str, Any]:
    return {
        "apiServer": "https://127.0.0.1:6443",
        "tokenFile": "token",
        "namespace": "pilots",
        "agent": {"certs": "/etc/provisionerd/certs"},
        "templates": [
            {
                "templateId": "gpu",
                "maxNumber": 4,
                "image": "agent:1",
                "cpu": "2",
                "memory": "4Gi",
                "probes": PROBES,
                **template,
            }
        ],
    }


def kubernetes_expand(text: str, env: Mapping[str, str]) -> str:
    """What the kubelet makes of one container command entry (a port of Kubernetes'
    ``third_party/forked/golang/expansion/expand.go``): ``$$`` is one ``$``; ``$(NAME)`` is NAME's value when the
    container defines it, else left as it is; a ``$`` before anything else, or last, stays."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and ")" in text[i + 2 :]:
            name = text[i + 2 : text.index(")", i + 2)]
            out.append(env.get(name, f"$({name})"))
            i += len(name) + 3
        else:
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)


def agent_argv(manifest: Mapping[str, Any], pod_name: str = "pvd-0") -> list[str]:
    """The agent's argv as the pod runs it: Kubernetes expands the command, the entry's ``"$@"`` passes the rest."""
    command = [kubernetes_expand(a, {"POD_NAME": pod_name}) for a in manifest["spec"]["containers"][0]["command"]]
    assert command[: len(ENTRY)] == ENTRY
    return command[len(ENTRY) :]


def test_the_expansion_port_does_what_kubernetes_documents() -> None:
    env = {"POD_NAME": "p"}
    assert kubernetes_expand("$(POD_NAME)", env) == "p" and kubernetes_expand("$(OTHER)", env) == "$(OTHER)"
    assert kubernetes_expand("$$(POD_NAME)", env) == "$(POD_NAME)" and kubernetes_expand("a$$b", env) == "a$b"
    assert kubernetes_expand("$HOME $", env) == "$HOME $" and kubernetes_expand("$(", env) == "$("


def test_each_probe_reaches_the_pods_agent_as_one_argument_exactly_as_configured() -> None:
    config = Config.from_document(document(reprobeInterval=60), PLUGIN)
    argv = agent_argv(pod_manifest(config, config.templates["gpu"], "pvd-0", {}, BOOT))
    given = [a for a in argv if a.startswith("--probe")]
    assert given == [f"--probe={name}={command}" for name, command in sorted(PROBES.items())]
    assert dict(capabilities.parse_probe(a.removeprefix("--probe=")) for a in given) == PROBES
    assert argv[argv.index("--reprobe-interval") + 1] == "60"
    assert argv[argv.index("--machine-id") + 1] == "pvd-0"  # the plugin's own $(POD_NAME) still expands


@given(st.text(alphabet="$()AB_ x", max_size=30))
def test_a_command_entry_survives_kubernetes_expansion_whatever_its_dollars(text: str) -> None:
    assert kubernetes_expand(literal(text), {"POD_NAME": "p", "A": "expanded"}) == text


def test_a_template_without_probes_passes_none() -> None:
    doc = document()
    del doc["templates"][0]["probes"]
    config = Config.from_document(doc, PLUGIN)
    argv = agent_argv(pod_manifest(config, config.templates["gpu"], "pvd-0", {}, BOOT))
    assert not any(a.startswith("--probe") or a == "--reprobe-interval" for a in argv)


class FakeApi:
    """No quota; ``create_pod`` keeps each manifest (with a uid) and ``create_secret`` accepts."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def list_quotas(self) -> dict[str, Any]:
        return {"items": []}

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        pod = {**body, "metadata": {**body["metadata"], "uid": f"uid-{len(self.pods)}"}}
        self.pods.append(pod)
        return pod

    def create_secret(self, body: dict[str, Any]) -> dict[str, Any]:
        return body


def test_a_request_cannot_add_or_change_a_probe(tmp_path: Path) -> None:
    """``requestMachines`` with probes in its ``userData`` (passed through by the contract) and its bootstraps
    (refused by the contract): the pods get the config's only."""
    from k8s_plugin.plugin import Plugin
    from k8s_plugin.store import Store

    config = Config.from_document(document(), PLUGIN)
    api = FakeApi()
    plugin = Plugin(config, Store(tmp_path / "data"), api)  # type: ignore[arg-type]
    tags = {
        "provisionerd:cluster": "c1",
        "provisionerd:provider": "k8s",
        "provisionerd:op": "op1",
        "provisionerd:epoch": "1.2",
    }
    hostile = {"probes": {"gputype": "echo H100"}, "provisionerd": {"probes": {"evil": "curl x | sh"}}}
    doc = {
        "template": {"templateId": "gpu", "machineCount": 2},
        "op_id": "op1",
        "tags": tags,
        "userData": hostile,
        "bootstrap": [
            {**BOOT, "instanceRef": f"c1/i-{i}", "joinToken": "J" * 32, "probes": {"evil": "true"}} for i in range(2)
        ],
    }
    with pytest.raises(PluginError, match=r"bootstrap\[0\]\.probes"):  # the contract has no place for one there
        plugin.handle("requestMachines", doc)
    assert api.pods == []
    for boot in doc["bootstrap"]:
        del boot["probes"]
    plugin.handle("requestMachines", doc)
    assert len(api.pods) == 2
    for pod in api.pods:
        given = [a for a in agent_argv(pod) if a.startswith("--probe")]
        assert given == [f"--probe={name}={command}" for name, command in sorted(PROBES.items())]
        assert "evil" not in json.dumps(pod) and "H100" not in json.dumps(pod)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"probes": {f"p{i}": "true" for i in range(5)}}, "templates[0] ('gpu').probes: at most 4, not 5"),
        ({"probes": {"bad name": "true"}}, "'bad name' does not match"),
        ({"probes": {"x" * 33: "true"}}, "does not match"),
        ({"probes": {"gputype": ""}}, "should be non-empty"),
        ({"probes": {"gputype": "x" * 1025}}, "('gpu').probes.gputype: the command is longer than 1024 characters"),
        ({"probes": {"gputype": 1}}, "is not of type 'string'"),
        ({"probes": "nvidia-smi"}, "is not of type 'object'"),
        ({"probes": {"gputype": " "}}, "('gpu').probes.gputype: the command is blank"),
        ({"probes": {"gputype": "a\r\nb"}}, "('gpu').probes.gputype: the command must be one line"),
        ({"probes": {"type": "uname -m"}}, "('gpu').probes.type: the agent reports 'type' itself"),
        ({"reprobeInterval": 1}, "('gpu').reprobeInterval: expected 0 (never) or 10 to 86400 seconds, got 1"),
        ({"reprobeInterval": 100000}, "is greater than the maximum of 86400"),
        ({"reprobeInterval": None}, "is not of type 'number'"),
    ],
)
def test_invalid_probe_config_is_a_provider_error_naming_the_problem(changes: Any, fragment: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        Config.from_document(document(**changes), PLUGIN)
    assert caught.value.code == "provider_error" and fragment in caught.value.message


def test_the_shipped_example_has_a_gpu_template_with_a_probe() -> None:
    config = Config.from_document(json.loads((PLUGIN / "conf.example" / "kubernetes.json").read_text()), PLUGIN)
    gpu = config.templates["pilot-gpu"]
    assert set(gpu.probes) == {"gputype"} and "gputype" in gpu.attributes and gpu.reprobe_interval == 300
    assert config.templates["pilot-4c"].probes == {}
