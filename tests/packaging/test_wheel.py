"""The wheel is the product: built as a user builds it, installed outside any checkout, it runs the demo to ``ok``.

One wheel a run (under pytest-xdist the first worker to need it builds it, the others wait on a lock and take it:
``make test`` spreads this module's tests over its workers), and one install of it a worker, serves every test
here: the source tree is copied to a temporary directory (tracked and
untracked files alike, without the venv, caches and build output), built with ``python -m build --wheel`` (build
isolation: setuptools comes from the index, as for a user), and the copy is deleted, so no path into a source tree
can work afterwards. The wheel goes into a fresh venv (no pip of its own: this interpreter's pip installs into it
with ``--python``, ``--no-deps --no-index``) whose ``.pth`` line adds this environment's site-packages for the
dependencies only: a path line is not a site directory, so the editable install's own ``.pth`` there is not run
and the checkout stays unreachable (checked below). That takes seconds where resolving the dependencies from the
index into the venv takes minutes (pycapnp, cryptography).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import attrs
import pytest

#: long: the wheel's build and its installs take a minute and more of one worker.
pytestmark = [pytest.mark.process, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
#: Not part of a source tree a user builds from.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache", ".hypothesis", "demo-*",
    "target", "_fastwire*.so",  # cargo's build output and the editable install's native codec
)  # fmt: skip
#: This environment's site-packages: the installed venv finds the dependencies there.
DEPS = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
SHIPPED = (
    "local",
    "simulated",
    "aws_ec2",
    "slurm",
    "kubernetes",
    "examples/bash",
    "examples/node",
    "examples/python",
    "examples/lsf_legacy",
)


@attrs.frozen
class Installed:
    wheel: Path
    venv: Path
    home: Path  # HOME, TMPDIR and cwd of every command run from the install
    seconds: dict[str, float]

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self) -> dict[str, str]:
        """A clean environment: no PYTHONPATH, no VIRTUAL_ENV; PATH has the venv first, then the system's (bash,
        node, ...)."""
        return {
            "PATH": os.pathsep.join([str(self.bin), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(self.home),
            "TMPDIR": str(self.home),
            "LANG": "C.UTF-8",
        }

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=self.home, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )


def _timed(seconds: dict[str, float], step: str, argv: list[str]) -> None:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    seconds[step] = round(time.monotonic() - start, 1)
    assert done.returncode == 0, f"{step}: {argv}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def _built_wheel(tmp_path_factory: pytest.TempPathFactory, worker_id: str, seconds: dict[str, float]) -> Path:
    """The run's wheel: built by the first worker that asks, under a lock in the directory the run's workers share
    (without xdist, this session's own); the build's seconds are the builder's, said by every worker."""
    base = tmp_path_factory.getbasetemp()
    shared = (base if worker_id == "master" else base.parent) / "wheel-build"
    shared.mkdir(exist_ok=True)
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the builder's steps are each bounded (300 s): so is this wait
        timing = shared / "seconds.json"
        if not timing.exists():
            source, built = shared / "src", {}
            shutil.copytree(REPO, source, symlinks=True, ignore=IGNORED)
            _timed(
                built,
                "build",
                [sys.executable, "-m", "build", "--wheel", "--outdir", str(shared / "dist"), str(source)],
            )
            shutil.rmtree(source)
            timing.write_text(json.dumps(built))
        seconds.update(json.loads(timing.read_text()))
    (wheel,) = (shared / "dist").glob("provisionerd-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    seconds: dict[str, float] = {}
    venv, home = base / "venv", base / "home"
    wheel = _built_wheel(tmp_path_factory, worker_id, seconds)
    _timed(seconds, "venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = Path(
        subprocess.check_output(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (purelib / "_provisionerd_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(DEPS)))
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    _timed(seconds, "install", [*pip, "--no-deps", "--no-index", str(wheel)])
    home.mkdir()
    return Installed(wheel, venv, home, seconds)


def processes_naming(text: str) -> list[tuple[int, str]]:
    """Live processes of this user whose command line contains ``text``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
            state = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if raw and text.encode() in raw and state[state.rfind(")") + 2 :].split()[0] not in ("Z", "X"):
            found.append((int(entry.name), raw.decode(errors="replace").replace("\0", " ")))
    return found


def test_the_installed_code_is_the_wheels_not_the_checkouts(installed: Installed) -> None:
    probe = "import sys, provisionerd, refcontroller; print(provisionerd.__file__); print(refcontroller.__file__)"
    done = installed.run(str(installed.bin / "python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        assert Path(line).is_relative_to(installed.venv), line
    # The checkout is not on the path (only the dependencies' directory, which may be a venv inside it): not as
    # code, not as a namespace package (its providers/ directory).
    done = installed.run(str(installed.bin / "python"), "-c", "import sys; print(*sys.path, sep=chr(10))")
    paths = {Path(p).resolve() for p in done.stdout.splitlines() if p} - {Path(d).resolve() for d in DEPS}
    assert not [p for p in paths if p.is_relative_to(REPO)]
    assert installed.run(str(installed.bin / "python"), "-c", "import providers").returncode != 0


def test_the_wheel_carries_the_native_codec_and_the_install_uses_it(installed: Installed) -> None:
    if shutil.which("cargo") is None and not os.environ.get("CI"):
        pytest.skip("no cargo here: the wheel is built without the native codec (the reference codec alone)")
    with zipfile.ZipFile(installed.wheel) as wheel:
        assert [n for n in wheel.namelist() if n.startswith("provisionerd/wire/_fastwire")], wheel.namelist()
    probe = (
        "from provisionerd.wire import codec, _fastwire; print(codec._native_codec() is not None, _fastwire.__file__)"
    )
    done = installed.run(str(installed.bin / "python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    used, path = done.stdout.split()
    assert used == "True" and Path(path).is_relative_to(installed.venv)


def test_the_wheel_holds_every_runtime_file_with_its_mode(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        modes = {i.filename: i.external_attr >> 16 for i in wheel.infolist()}
    assert not [n for n in modes if "__pycache__" in n or n.endswith(".pyc")]
    expected = {f"schemas/{p.name}": p for p in (REPO / "schemas").glob("*.json")}
    expected |= {f"protocol/{p.name}": p for p in (REPO / "protocol").glob("*.capnp")}
    expected["contrib/systemd/provisionerd.service"] = REPO / "contrib" / "systemd" / "provisionerd.service"
    expected["example-config.toml"] = REPO / "docs" / "example-config.toml"
    for name in SHIPPED:
        for path in (REPO / "providers" / name).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                expected[f"providers/{path.relative_to(REPO / 'providers')}"] = path
    assert len(expected) > 100
    missing = [k for k in expected if f"provisionerd/resources/{k}" not in modes]
    assert not missing
    for key, path in expected.items():
        executable = bool(path.stat().st_mode & stat.S_IXUSR)
        assert bool(modes[f"provisionerd/resources/{key}"] & stat.S_IXUSR) == executable, key


def test_provider_path_points_inside_the_install(installed: Installed) -> None:
    for name in SHIPPED:
        done = installed.run(str(installed.bin / "provisionerd"), "provider", "path", name)
        assert done.returncode == 0, done.stderr
        path = Path(done.stdout.strip())
        assert path.is_dir() and path.is_relative_to(installed.venv), (name, path)
    local = Path(installed.run(str(installed.bin / "provisionerd"), "provider", "path", "local").stdout.strip())
    assert os.access(local / "provider", os.X_OK) and os.access(local / "requestMachines.sh", os.X_OK)
    assert installed.run(str(installed.bin / "provisionerd"), "provider", "path", "nope").returncode == 2


@pytest.mark.parametrize(
    ("name", "transport"),
    [
        ("simulated", "persistent"),
        ("examples/bash", "oneshot"),
        ("examples/node", "persistent"),
        ("examples/python", "persistent"),
        ("examples/python", "oneshot"),
        ("examples/lsf_legacy", "oneshot"),
    ],
)
def test_the_installed_kit_passes_the_installed_plugins(installed: Installed, name: str, transport: str) -> None:
    """The conformance kit (the schemas) and the plugins work from the install (EC2 and Slurm need their backends:
    tests/aws, tests/slurm)."""
    if name == "examples/node" and shutil.which("node") is None:
        pytest.skip("node is not installed")
    plugin = installed.run(str(installed.bin / "provisionerd"), "provider", "path", name).stdout.strip()
    done = installed.run(
        str(installed.bin / "provisionerd"), "provider", "check", "--json", "--transport", transport, plugin
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert json.loads(done.stdout)["failed"] == 0


@pytest.mark.parametrize("name", ["aws_ec2", "slurm", "kubernetes", "local", "simulated"])
def test_the_installed_plugins_import_the_installed_sdk(installed: Installed, name: str) -> None:
    """Each shipped plugin, started from the install as the daemon starts it (local and simulated under
    ``python -S``), imports the SDK of the wheel it came in: without a configuration it answers a typed error
    document (or, where it needs none, its description), never an ImportError."""
    plugin = Path(installed.run(str(installed.bin / "provisionerd"), "provider", "path", name).stdout.strip())
    env = {**installed.env(), "PROVISIONERD_PYTHON": str(installed.bin / "python"), "PRO_DATA_DIR": str(installed.home)}
    request = json.dumps({"id": 1, "action": "describeProvider", "input": {}}) + "\n"
    done = subprocess.run(
        [str(plugin / "provider")],
        input=request,
        cwd=installed.home,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (answer,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert answer["id"] == 1 and ("result" in answer or answer["error"]["code"] == "provider_error"), answer
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, done.stderr[-2000:]
    if name in ("local", "simulated"):  # they need no configuration: a full description
        assert answer["result"]["contractVersion"] == 1


def test_the_installed_demo_reaches_ok(installed: Installed) -> None:
    start = time.monotonic()
    try:
        done = installed.run(str(installed.bin / "provisionerd"), "demo", "--json", timeout=120)
    finally:
        survivors = processes_naming(str(installed.venv))
        for pid, _ in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    installed.seconds["demo"] = round(time.monotonic() - start, 1)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["ok"] is True and summary["joined"] == summary["returned"] == 8 and summary["leaked"] == 0
    assert not survivors, survivors
    print(f"wheel {installed.wheel.stat().st_size} bytes; seconds: {installed.seconds}")


def test_the_wheel_is_tagged_abi3_as_its_extension_is(installed: Installed) -> None:
    """One wheel for CPython 3.11 and later: its tag is abi3 when the native codec inside is built for the limited
    API (issue 33: a cp311-cp311 wheel carrying an abi3 extension, refused by pip on 3.12)."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        native = [n for n in wheel.namelist() if n.startswith("provisionerd/wire/_fastwire")]
        tags = [
            line.split(":", 1)[1].strip()
            for line in wheel.read("provisionerd-0.1.0.dist-info/WHEEL").decode().splitlines()
            if line.startswith("Tag:")
        ]
    if not native:
        pytest.skip("built without cargo: no native codec, nothing for the tag to match")
    assert all(n.endswith(".abi3.so") for n in native), native
    assert tags and all(t.startswith("cp311-abi3-") for t in tags), tags
    assert "-cp311-abi3-" in installed.wheel.name, installed.wheel.name


def python_version(python: str) -> tuple[int, int] | None:
    """The (major, minor) of a Python that runs (a pyenv shim for a version not selected does not)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or len(done.stdout.split()) != 2:
        return None
    major, minor = done.stdout.split()
    return int(major), int(minor)


def second_python() -> tuple[str, tuple[int, int]] | None:
    """A CPython 3.11+ of another minor version than this one, the newest found: ``PVD_SECOND_PYTHON``, then
    ``python3.N`` on PATH, then pyenv's versions, then uv's installed ones."""
    candidates = [os.environ.get("PVD_SECOND_PYTHON", "")]
    candidates += [shutil.which(f"python3.{n}") or "" for n in range(20, 10, -1)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted((str(p) for p in pyenv.glob("3.*/bin/python3")), reverse=True)
    if uv := shutil.which("uv"):
        for n in range(20, 10, -1):
            found = subprocess.run([uv, "python", "find", f"3.{n}"], capture_output=True, text=True, timeout=30)
            candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    found_versions: dict[tuple[int, int], str] = {}
    for python in filter(None, candidates):
        version = python_version(python)
        if version is not None and version >= (3, 11) and version[:2] != sys.version_info[:2]:
            found_versions.setdefault(version, python)
    if not found_versions:
        return None
    best = max(found_versions)
    return found_versions[best], best


def test_the_wheel_installs_and_runs_the_demo_on_a_second_python_minor_version(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same wheel, installed by pip (with its dependencies from the index) into a venv of another CPython minor
    version, reaches the demo's ``ok`` and uses the native codec there."""
    second = second_python()
    if second is None:
        pytest.skip(
            f"no CPython 3.11+ other than {sys.version_info.major}.{sys.version_info.minor} here (looked for"
            " PVD_SECOND_PYTHON, python3.N on PATH, pyenv's versions and uv's; Debian bookworm packages none)"
        )
    python, version = second
    base = tmp_path_factory.mktemp("w2")  # short: the demo's admin socket lives under HOME (Unix path limit)
    venv, home = base / "venv", base / "home"
    home.mkdir()
    _timed(installed.seconds, "second venv", [python, "-m", "venv", str(venv)])
    _timed(installed.seconds, "second install", [str(venv / "bin" / "pip"), "install", "-q", str(installed.wheel)])
    other = Installed(installed.wheel, venv, home, installed.seconds)
    probe = (
        "from provisionerd.wire import codec; import sys; print(codec._native_codec() is not None,"
        " *sys.version_info[:2])"
    )
    done = other.run(str(other.bin / "python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    native, major, minor = done.stdout.split()
    assert (int(major), int(minor)) == version
    if shutil.which("cargo") is not None or os.environ.get("CI"):
        assert native == "True"  # the abi3 extension loads on the other version
    try:
        done = other.run(str(other.bin / "provisionerd"), "demo", "--json", timeout=120)
    finally:
        survivors = processes_naming(str(venv))
        for pid, _ in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["ok"] is True and summary["leaked"] == 0, summary
    assert not survivors, survivors
    print(f"wheel {installed.wheel.name} on Python {major}.{minor} ({python}): demo ok in {summary['seconds']} s")
