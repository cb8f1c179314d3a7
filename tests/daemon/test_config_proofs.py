"""``config.proofs``: what ``config check``, a start and a SIGHUP reload prove about the world a config names
(lease margin against the controller's TTL, heartbeat against its timeout, provider paths, TLS files). Each
problem names its field."""

from __future__ import annotations

import datetime
import logging
import sys
from pathlib import Path

import attrs
import pytest

from provisionerd.cli import main as cli
from provisionerd.config.loader import (
    Config,
    ControllerSettings,
    LeaseSettings,
    LegacyOptions,
    ProviderConfig,
    TlsPaths,
)
from provisionerd.config.proofs import load_proven, prove
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.current_config import CurrentConfig, NoReloadWatcher, ReloadResult
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.errors import ConfigError
from provisionerd.pki.certs import init_certs
from provisionerd.telemetry.events import EventLog

NOW = datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    global NOW
    # The proofs' "now" is when the certificates are made: taken at collection it could be more than their 5 minutes
    # of backdating before them (a suite that reaches this module later than that: "not valid before").
    NOW = datetime.datetime.now(datetime.UTC)
    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, "proofs")
    return directory


def oneshot_dir(where: Path) -> Path:
    where.mkdir(parents=True)
    for action in ("requestMachines", "getRequestStatus"):
        script = where / f"{action}.sh"
        script.write_text("#!/bin/sh\nexit 1\n")
        script.chmod(0o755)
    return where


def good(tmp_path: Path, certs: Path) -> Config:
    return Config(
        cluster="proofs",
        identity="prov-a",
        controller=ControllerSettings(("127.0.0.1:7400",), heartbeat_interval=2.0, heartbeat_timeout=6.0),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=2.0, controller_ttl=30.0),
        providers=(
            ProviderConfig("one", "oneshot", path=oneshot_dir(tmp_path / "plugins" / "one")),
            ProviderConfig("two", "persistent", argv=(sys.executable, "-c", "pass")),
        ),
    )


def check(config: Config, path: Path, capsys) -> tuple[int, list[str]]:
    written = path
    from provisionerd.config.writer import daemon_config_toml

    written.write_text(daemon_config_toml(config))
    code = cli.main(["config", "check", str(written)])
    return code, capsys.readouterr().err.splitlines()


def test_a_good_config_proves(tmp_path, certs, capsys):
    config = good(tmp_path, certs)
    assert prove(config, NOW) == []
    code, err = check(config, tmp_path / "pd.toml", capsys)
    assert (code, err) == (0, [])


def test_margin_not_below_the_controller_ttl_names_lease_margin(tmp_path, certs, capsys):
    config = attrs.evolve(good(tmp_path, certs), lease=LeaseSettings(margin=10.0, controller_ttl=3.0))
    code, err = check(config, tmp_path / "pd.toml", capsys)
    assert code == 1
    assert err[1:] == [
        f"{tmp_path / 'pd.toml'}: lease.margin: margin 10s is not below the lease TTL of 3s: every grant is expired"
        " when it arrives (lease.controller_ttl)"
    ]
    # A margin below the TTL that still lapses before the first renewal (at ttl/3) is refused too.
    tight = attrs.evolve(config, lease=LeaseSettings(margin=2.5, controller_ttl=3.0))
    assert [p.partition(":")[0] for p in prove(tight, NOW)] == ["lease.margin"]
    assert prove(attrs.evolve(config, lease=LeaseSettings(margin=10.0)), NOW) == []  # TTL unknown: nothing to prove


def test_heartbeat_interval_against_the_controllers_timeout(tmp_path, certs):
    config = good(tmp_path, certs)
    slow = attrs.evolve(config, controller=attrs.evolve(config.controller, peer_timeout=3.0))
    (problem,) = prove(slow, NOW)
    assert problem.startswith("controller.heartbeat_interval: 2s: fewer than two heartbeats fit")
    assert prove(attrs.evolve(config, controller=attrs.evolve(config.controller, peer_timeout=4.0)), NOW) == []


def test_provider_paths(tmp_path, certs):
    config = good(tmp_path, certs)
    missing = tmp_path / "nowhere" / "local"
    lazy = tmp_path / "plugins" / "lazy"
    lazy.mkdir(parents=True)
    (lazy / "requestMachines.sh").write_text("#!/bin/sh\n")
    (lazy / "requestMachines.sh").chmod(0o644)
    empty = tmp_path / "plugins" / "empty"
    empty.mkdir()
    providers = (
        ProviderConfig("a", "oneshot", path=missing),
        ProviderConfig("b", "oneshot", path=lazy),
        ProviderConfig("c", "oneshot", path=empty),
        ProviderConfig("d", "persistent", argv=("/no/such/provider-binary",)),
        ProviderConfig("e", "persistent", path=tmp_path / "plugins" / "one"),  # a dir without `provider`
        ProviderConfig(
            "f",
            "oneshot",
            path=tmp_path / "plugins" / "one",
            conf_dir=tmp_path / "no-conf",
            legacy=LegacyOptions(journal=tmp_path / "no-dir" / "journal.json"),
        ),
    )
    problems = prove(attrs.evolve(config, providers=providers), NOW)
    assert [p.partition(": ")[0] for p in problems] == [
        "providers[0].path",
        "providers[1].path",
        "providers[2].path",
        "providers[3].argv[0]",
        "providers[4].path",
        "providers[5].conf_dir",
        "providers[5].legacy.journal",
    ]
    assert f"{missing} does not exist" in problems[0]
    assert "provisionerd provider path local" in problems[0]  # names the installed shipped plugin
    assert "requestMachines.sh is not executable" in problems[1]
    assert "holds no <action>.sh script" in problems[2]
    assert "not an executable file" in problems[3]
    assert "provider does not exist" in problems[4]


def test_tls_files(tmp_path, certs, capsys):
    config = good(tmp_path, certs)
    other = tmp_path / "other-certs"
    init_certs(other, "othercluster")

    def tls_problems(**paths: Path) -> list[str]:
        return prove(attrs.evolve(config, tls=attrs.evolve(config.tls, **paths)), NOW)

    (missing,) = tls_problems(key=tmp_path / "missing.key")
    assert missing.startswith(f"tls.key: cannot read {tmp_path / 'missing.key'}")
    assert tls_problems(key=certs / "worker.key") == [
        f"tls.key: does not match the certificate in tls.cert ({certs / 'provisioner.pem'})"
    ]
    assert tls_problems(cert=other / "provisioner.pem", key=other / "provisioner.key") == [
        f"tls.cert: is not issued by the CA in tls.ca ({certs / 'ca.pem'})"
    ]
    (garbage,) = tls_problems(ca=certs / "provisioner.key")
    assert garbage.startswith("tls.ca: ") and "no PEM certificate" in garbage
    (not_a_key,) = tls_problems(key=certs / "provisioner.pem")
    assert not_a_key.startswith("tls.key: ") and "BEGIN" not in not_a_key
    later = prove(config, NOW + datetime.timedelta(days=4000))
    assert [p.partition(": ")[0] for p in later] == ["tls.ca", "tls.cert"]
    assert all("expired at" in p for p in later)
    # Through the CLI: the field is named, and exit 1.
    code, err = check(
        attrs.evolve(config, tls=TlsPaths(certs / "ca.pem", certs / "provisioner.pem", tmp_path / "k")),
        tmp_path / "pd.toml",
        capsys,
    )
    assert code == 1 and err[1].startswith(f"{tmp_path / 'pd.toml'}: tls.key: cannot read")


def test_the_document_alone_is_still_checkable(tmp_path, certs, capsys):
    config = attrs.evolve(good(tmp_path, certs), tls=TlsPaths(Path("/no/ca"), Path("/no/cert"), Path("/no/key")))
    path = tmp_path / "pd.toml"
    write_daemon_config(config, path)
    assert cli.main(["config", "check", "--document-only", str(path)]) == 0
    assert cli.main(["config", "check", str(path)]) == 1
    capsys.readouterr()


@attrs.define
class _Core:
    """What the SIGHUP reload (``DaemonCore.reload``) reads and writes of the daemon."""

    current: CurrentConfig
    events: EventLog = attrs.field(factory=lambda: EventLog(keep=100))
    reload_watcher: NoReloadWatcher = attrs.field(factory=NoReloadWatcher)

    @property
    def config(self) -> Config:
        return self.current.config

    def _reload(self, new: Config | None) -> ReloadResult:
        return DaemonCore._reload(self, new)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda c, tmp: attrs.evolve(c, lease=LeaseSettings(margin=10.0, controller_ttl=3.0)), id="margin"),
        pytest.param(
            lambda c, tmp: attrs.evolve(c, providers=(attrs.evolve(c.providers[0], path=tmp / "gone"),)), id="path"
        ),
        pytest.param(lambda c, tmp: attrs.evolve(c, tls=attrs.evolve(c.tls, key=tmp / "gone.key")), id="tls-missing"),
        pytest.param(
            lambda c, tmp: attrs.evolve(c, tls=attrs.evolve(c.tls, key=c.tls.key.parent / "admin.key")),
            id="tls-mismatch",
        ),
    ],
)
def test_a_reload_that_fails_a_proof_is_refused(tmp_path, certs, breakage, caplog):
    path = tmp_path / "pd.toml"
    running = load_proven(write_daemon_config(good(tmp_path, certs), path).source)
    core = _Core(CurrentConfig(running))
    write_daemon_config(breakage(running, tmp_path), path)
    with pytest.raises(ConfigError):
        load_proven(path)
    with caplog.at_level(logging.ERROR):
        result = DaemonCore.reload(core)  # type: ignore[arg-type]
    assert result.outcome == "failed"
    assert core.config is running
    (failed,) = core.events.of_kind("config_reload_failed")
    assert failed["problems"] and all(":" in p for p in failed["problems"])
    assert not list(core.events.of_kind("config_reloaded"))


def test_an_unknown_key_does_not_hide_a_margin_the_ttl_cannot_use(tmp_path, certs, capsys):
    """issue 32: ``config check`` stopped after the document stage, so an unknown key hid ``margin >= TTL``."""
    from provisionerd.config.writer import daemon_config_toml

    config = attrs.evolve(good(tmp_path, certs), lease=LeaseSettings(margin=10.0, controller_ttl=3.0))
    path = tmp_path / "pd.toml"
    path.write_text(daemon_config_toml(config).replace("[lease]", "[lease]\nmargn = 1"))
    assert cli.main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: 2 problem(s)",
        f"{path}: lease.margn: unknown key",
        f"{path}: lease.margin: margin 10s is not below the lease TTL of 3s: every grant is expired when it arrives"
        " (lease.controller_ttl)",
    ]


def test_a_proof_about_a_refused_value_is_not_reported_on_its_default(tmp_path, certs):
    """A wrong ``lease.margin`` is reported once, by the document; its default (2 s, too wide for a 3 s TTL) is
    not judged by the proofs as if the operator had written it."""
    from provisionerd.config.proofs import check_all
    from provisionerd.config.writer import daemon_config_toml

    config = attrs.evolve(good(tmp_path, certs), lease=LeaseSettings(margin=1.0, controller_ttl=3.0))
    path = tmp_path / "pd.toml"
    path.write_text(daemon_config_toml(config).replace("margin = 1.0", 'margin = "one"'))
    assert 'margin = "one"' in path.read_text()
    result, problems = check_all(path, NOW)
    assert result is None
    assert [p.partition(":")[0] for p in problems] == ["lease.margin"]
    assert "is not of type 'number'" in problems[0]


def test_a_document_that_cannot_be_salvaged_says_the_rest_was_not_checked(tmp_path, certs):
    from provisionerd.config.proofs import NOT_PROVEN, check_all

    path = tmp_path / "pd.toml"
    path.write_text('cluster = "x"\n')  # identity, controller, tls, providers missing
    result, problems = check_all(path, NOW)
    assert result is None and problems[-1] == f"(checks): {NOT_PROVEN}"
    assert "identity: is required but missing" in problems
