"""The agent and daemon images of ``contrib/image`` (built from Debian packages and this checkout's wheel by
``.ci/agent-image``, cached): what their OCI layout says and holds, read with umoci and from the layers
themselves, and the agent's image run by podman joining a reference controller on loopback.

podman runs here with a storage of each test's own, the runc runtime and limits no higher than its own:
``contrib/image/README.md`` ("Running it here") says why each is needed on these machines.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agent.ctl_client import Provisioner
from rigs import agents, backends, procs, wait

from refcontroller.api import open_refcontroller_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "agent-image"
VENV = "/opt/provisionerd"
#: The venv's site-packages as a layer names it (no leading slash).
SITE = f"{VENV[1:]}/lib/python3.11/site-packages"
VERSION = importlib.metadata.version("provisionerd")
#: Where the agent's container finds the worker certificates (providers/kubernetes/conf.example's agent.certs).
CERTS = "/etc/provisionerd/certs"


@pytest.fixture(scope="module")
def layout() -> Path:
    """The OCI image layout of the cached build; built first when the cache lacks it and this machine can."""
    found = procs.run([SCRIPT, "path"])
    if found.returncode != 0:
        if os.geteuid() != 0 or not (shutil.which("mmdebstrap") and shutil.which("umoci")):
            backends.missing("the agent image is not built (.ci/agent-image build: root, mmdebstrap and umoci)")
        built = procs.run([SCRIPT, "build"], timeout=1800)
        assert built.returncode == 0, f".ci/agent-image build failed:\n{built.stderr[-4000:]}"
    return Path(found.stdout.strip()) / "oci"


def blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / digest.replace(":", "/")


def image(layout: Path, tag: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The image configuration and the layer descriptors of ``tag``."""
    index = json.loads((layout / "index.json").read_text())
    refs = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}
    manifest = json.loads(blob(layout, refs[tag]["digest"]).read_text())
    return json.loads(blob(layout, manifest["config"]["digest"]).read_text()), manifest["layers"]


def members(layout: Path, layer: dict[str, Any]) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(blob(layout, layer["digest"]), "r:*") as tar:
        return {m.name.removeprefix("./"): m for m in tar.getmembers()}


def read_member(layout: Path, layer: dict[str, Any], name: str) -> bytes:
    with tarfile.open(blob(layout, layer["digest"]), "r:*") as tar:
        for member in tar:
            if member.name.removeprefix("./") == name:
                handle = tar.extractfile(member)
                assert handle is not None, name
                return handle.read()
    raise AssertionError(f"{name} is not in the layer")


def umoci(*args: str | Path) -> subprocess.CompletedProcess[str]:
    done = procs.run([backends.need("umoci", "apt-get install umoci"), *args])
    assert done.returncode == 0, done.stderr
    return done


def test_the_layout_holds_the_agent_image_and_the_daemon_image_on_top_of_it(layout: Path) -> None:
    assert set(umoci("ls", "--layout", layout).stdout.split()) == {"agent", "daemon"}
    agent_config, agent_layers = image(layout, "agent")
    daemon_config, daemon_layers = image(layout, "daemon")
    # One layer made by mmdebstrap (no base image under it); the daemon's adds one and shares the agent's.
    assert len(agent_layers) == 1 and daemon_layers[:1] == agent_layers and len(daemon_layers) == 2
    history = json.loads(umoci("stat", "--image", f"{layout}:agent", "--json").stdout)["history"]
    assert "mmdebstrap --variant=essential" in history[0]["created_by"]
    for config in (agent_config, daemon_config):
        assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION
        assert config["config"]["Env"][0].startswith(f"PATH={VENV}/bin:")


def test_the_agent_image_runs_provisionerd_agent_of_this_checkout(layout: Path) -> None:
    config, (layer,) = image(layout, "agent")
    assert config["config"]["Entrypoint"] == [f"{VENV}/bin/provisionerd", "agent"]
    files = members(layout, layer)
    assert f"{SITE}/provisionerd-{VERSION}.dist-info/METADATA" in files
    assert "usr/bin/python3.11" in files and f"{VENV[1:]}/bin/provisionerd" in files
    if shutil.which("cargo") or backends.in_ci():
        assert f"{SITE}/provisionerd/wire/_fastwire.abi3.so" in files
    # The cached image is of this checkout: the package's modules are the ones here, byte for byte.
    for path in [ROOT / "provisionerd" / "cli" / "main.py", ROOT / "provisionerd" / "agent" / "__init__.py"]:
        name = f"{SITE}/{path.relative_to(ROOT)}"
        assert read_member(layout, layer, name) == path.read_bytes(), name
    # Only the daemon's image carries the extras.
    assert not [n for n in files if n.startswith((f"{SITE}/boto3", f"{SITE}/kubernetes/"))]


def test_the_daemon_image_adds_only_the_extras_under_the_venv(layout: Path) -> None:
    config, layers = image(layout, "daemon")
    assert config["config"]["Entrypoint"] == [f"{VENV}/bin/provisionerd"]
    assert config["config"]["Cmd"] == ["run", "--config", "/etc/provisionerd/provisionerd.toml"]
    added = members(layout, layers[1])
    for extra in ("boto3", "kubernetes"):
        assert [n for n in added if n.startswith(f"{SITE}/{extra}-")], extra
    assert not [n for n, m in added.items() if not m.isdir() and not n.startswith(f"{VENV[1:]}/")]


def podman(home: Path) -> list[str]:
    """podman with its own storage under ``home``, on runc and cgroupfs, its events in a file."""
    return [
        backends.need("podman", "apt-get install podman"),
        "--root",
        str(home / "storage"),
        "--runroot",
        str(home / "run"),
        "--runtime",
        backends.need("runc", "apt-get install runc"),
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
    ]


def oci(layout: Path, home: Path, tag: str) -> str:
    """The reference of the image ``tag`` of ``layout``, through a link in ``home`` (podman names the image after
    the path, which must then be a valid image name: ``~/.cache/...`` is not)."""
    images = home / "images"
    if not images.exists():
        images.symlink_to(layout)
    return f"oci:{images}:{tag}"


def run(home: Path, image: str, *args: str, options: tuple[str, ...] = ()) -> list[str]:
    """``podman run`` of ``image`` with ``args``, on the host's network, stdin attached. Its limits are set no
    higher than podman's own here (``nofile``: this process's; ``nproc``: 4096, under podman's 32768), since its
    default ``nofile`` (1048576) needs a capability root lacks on these machines (contrib/image/README.md)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return [
        *podman(home),
        "run",
        "--rm",
        "--interactive",
        "--network=host",
        f"--ulimit=nofile={nofile}:{nofile}",
        "--ulimit=nproc=4096:4096",
        *options,
        image,
        *args,
    ]


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    from provisionerd.pki.certs import init_certs

    init_certs(tmp_path / "certs", "imagecluster")
    return tmp_path / "certs"


@pytest.fixture
def podman_home() -> Iterator[Path]:
    """podman's storage for one test, under /tmp (podman refuses a run root longer than 50 characters); at the end
    every container and image in it is removed, then the directory. Hex only in its name: podman names an image
    it takes from ``oci:DIR`` after DIR, which must then be a valid image name (``.cache`` is not)."""
    home = Path("/tmp") / f"pvd-podman-{secrets.token_hex(6)}"
    home.mkdir(mode=0o700)
    try:
        yield home
    finally:
        procs.run([*podman(home), "rm", "--all", "--force", "--time", "0"], timeout=120)
        procs.run([*podman(home), "system", "reset", "--force"], timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def test_the_agent_image_run_by_podman_joins_a_reference_controller_on_loopback(
    layout: Path, certs: Path, podman_home: Path, tmp_path: Path
) -> None:
    ref = "imagecluster/i-podman"
    token = secrets.token_urlsafe(24)
    log = tmp_path / "agent.log"

    async def main() -> None:
        with trio.fail_after(240):
            async with open_refcontroller_process(
                certs, tmp_path / "ctl", replicas=1, lease_ttl=1.0, check_interval=0.5
            ) as ctl:
                provisioner = await Provisioner.join(certs, ctl.addresses, "image")
                try:
                    epoch = await provisioner.lease("image")
                    await provisioner.commit_intent("image", epoch, "op-image", [ref], [token])
                finally:
                    await provisioner.aclose()
                # The certificates mounted read-only where the Kubernetes plugin's example config has them.
                argv = run(podman_home, oci(layout, podman_home, "agent"), options=(f"--volume={certs}:{CERTS}:ro",))
                argv += ["--certs", CERTS, "--controllers", ",".join(ctl.addresses), "--instance-ref", ref]
                argv += ["--token-stdin", "--heartbeat", "0.5"]
                with agents.agent(argv, log, token.encode() + b"\n") as container:

                    async def joined() -> dict[str, Any] | None:
                        hosts = {h["instance_ref"]: h for h in (await ctl.status())["hosts"]}
                        if container.poll() is not None:
                            raise AssertionError(f"podman run exited {container.returncode}:\n{log.read_text()}")
                        return hosts[ref] if hosts.get(ref, {}).get("status") == "idle" else None

                    host = await wait.until("the container's agent joined", joined, 180, 0.2)
                    assert host["instance_ref"] == ref
                    # podman passes SIGTERM on to the agent (its stop signal), which leaves cleanly.
                    container.send_signal(signal.SIGTERM)
                    code = await trio.to_thread.run_sync(lambda: container.wait(timeout=60))
                    assert code == 0, log.read_text()

    trio.run(main)
    text = log.read_text()
    assert f"starting instance_ref={ref!r}" in text and token not in text


def test_the_daemon_image_run_by_podman_runs_the_demo_to_ok(layout: Path, podman_home: Path) -> None:
    """``provisionerd demo`` inside the daemon's image: a controller, the daemon, the local provider's agents and
    a failover, all in the container."""
    done = procs.run(run(podman_home, oci(layout, podman_home, "daemon"), "demo"), timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    said = done.stdout + done.stderr
    assert "provisionerd demo: ok" in said and "leaked agent processes: 0" in said


def test_the_agent_image_copied_by_skopeo_to_a_registry_on_loopback_runs_from_there(
    layout: Path, podman_home: Path, tmp_path: Path
) -> None:
    """The site's path (docs/kubernetes.md): ``skopeo copy oci:OUT/oci:agent docker://REGISTRY/...``, then a runtime
    pulls it by name. The registry is Debian's docker-registry (the CNCF distribution), plain HTTP on loopback."""
    registry = backends.need("docker-registry", "apt-get install docker-registry")
    skopeo = backends.need("skopeo", "apt-get install skopeo")
    port = wait.free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    name = f"127.0.0.1:{port}/provisionerd-agent:{VERSION}"
    with procs.popen([registry, "serve", config], tmp_path / "registry.log"):
        wait.blocking("the registry to listen", wait.accepts("127.0.0.1", port), 30)
        copied = procs.run([skopeo, "copy", "--dest-tls-verify=false", f"oci:{layout}:agent", f"docker://{name}"])
        assert copied.returncode == 0, copied.stderr
        ran = procs.run(run(podman_home, name, "--help", options=("--tls-verify=false",)))
    assert ran.returncode == 0, ran.stderr
    assert "join the cluster controller as a worker" in ran.stdout
