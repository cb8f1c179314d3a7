"""``contrib/systemd/provisionerd.service``: ``systemd-analyze verify`` passes on it, and it says what the docs say.

``verify`` checks that ExecStart's binary exists. The shipped unit names the documented install path
(``/opt/provisionerd/bin/provisionerd``, docs/operations.md); the test verifies a copy whose ExecStart is this
venv's ``provisionerd``, every other line unchanged. CI installs Debian's ``systemd`` package (.ci/run) for it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rigs import backends

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib" / "systemd" / "provisionerd.service"
INSTALLED = "/opt/provisionerd/bin/provisionerd"


def analyzer() -> str:
    return backends.need("systemd-analyze", "Debian: systemd")


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def local_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart and ExecReload pointing to this venv's provisionerd (which exists), nothing else
    changed."""
    binary = Path(sys.executable).parent / "provisionerd"
    assert binary.exists(), binary
    text = UNIT.read_text() if text is None else text
    assert f"ExecStart={INSTALLED} " in text
    copy = tmp_path / "provisionerd.service"
    text = text.replace(f"ExecStart={INSTALLED} ", f"ExecStart={binary} ")
    copy.write_text(text.replace(f"ExecReload={INSTALLED} ", f"ExecReload={binary} "))
    return copy


def analyze(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([analyzer(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.integration
def test_systemd_analyze_verify_passes(tmp_path):
    result = analyze("verify", local_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # not even a warning


@pytest.mark.integration
def test_verify_can_fail(tmp_path):
    """The check above is not vacuous: a misspelt directive and a missing binary both fail it."""
    broken = UNIT.read_text().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes")
    result = analyze("verify", local_copy(tmp_path, broken))
    assert "NoNewPrivilege" in result.stderr
    result = analyze("verify", UNIT)  # the shipped unit's ExecStart is not installed here
    assert result.returncode != 0 and "not executable" in result.stderr


def systemd_version() -> int:
    first = subprocess.run([analyzer(), "--version"], capture_output=True, text=True, check=False).stdout.split()
    return int(first[1]) if len(first) > 1 and first[1].isdigit() else 0


@pytest.mark.integration
def test_the_sandbox_exposure_stays_low(tmp_path):
    """``systemd-analyze security`` scores the hardening (0 best, 10 worst); the unit scores 1.7 today."""
    if systemd_version() < 250:
        pytest.skip("systemd-analyze security --offline/--threshold need systemd 250 or later")
    result = analyze("security", "--offline=yes", "--threshold=25", local_copy(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_the_unit_says_what_operations_md_says():
    unit = settings(UNIT.read_text())
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "Restart": "on-failure",
        # A reload whose result systemctl sees (systemd 252: the command's exit status; tests/ops/test_reload_real.py).
        "ExecReload": f"{INSTALLED} reload --socket /run/provisionerd/admin.sock",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "StateDirectory": "provisionerd",
        "StateDirectoryMode": "0700",
        "RuntimeDirectory": "provisionerd",
        "RuntimeDirectoryMode": "0700",
        "UMask": "0077",
        "User": "provisionerd",
        # A one-shot call's wrapper must outlive the daemon (docs/providers.md): systemd kills the daemon only.
        "KillMode": "process",
    }
    for key, value in expected.items():
        assert unit.get(key) == [value], key
    assert int(unit["WatchdogSec"][0]) >= 20  # the reconcile loop turns every 10 s at least (3 passes: stall)
    (exec_start,) = unit["ExecStart"]
    assert exec_start.startswith(f"{INSTALLED} run --config /etc/provisionerd/provisionerd.toml")
    ops = (ROOT / "docs" / "operations.md").read_text()
    assert INSTALLED in ops and "contrib/systemd/provisionerd.service" in ops
    assert "`KillMode=process`" in ops and "A call's result outlives the daemon" in ops
    providers = (ROOT / "docs" / "providers.md").read_text()
    assert "**A call's result outlives the daemon.**" in providers  # the promise the kill mode keeps


def test_the_credential_locations_protecthome_leaves_are_documented():
    ops = (ROOT / "docs" / "operations.md").read_text()
    unit = UNIT.read_text()
    assert settings(unit)["ProtectHome"] == ["yes"]
    for where in ("/etc/provisionerd/aws/credentials", "AWS_SHARED_CREDENTIALS_FILE", "/etc/provisionerd/kubeconfig"):
        assert where in ops and where in unit, where
    assert "~/.aws" in ops and "~/.kube" in ops
