"""The config writer: a ``Config`` value written as TOML reads back, through the daemon's own loader, as the same
value; a value the loader refuses raises the loader's ``ConfigError`` and writes nothing."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    LegacyOptions,
    OrphanSettings,
    ProviderConfig,
    ProviderTimeouts,
    TlsPaths,
)
from provisionerd.config.writer import daemon_config_toml, provisioner_tls, write_daemon_config
from provisionerd.domain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
ODD = 'q"uote \\back\\slash\\ ünïcødé ✓ 雪 \U0001f680 tab\there\nnew line \x7f end'  # every escape TOML has


def minimal(tmp: Path) -> Config:
    return Config(
        cluster="c1",
        identity="p1",
        controller=ControllerSettings(("ctl:7400",)),
        tls=provisioner_tls(tmp / "certs"),
        providers=(ProviderConfig("sim", "oneshot", path=tmp / "sim"),),
    )


def full(tmp: Path) -> Config:
    """Every field away from its default, both transports, every timeout key, all three legacy modes' spellings."""
    return Config(
        cluster="c-1.x_y",
        identity="prov-a",
        controller=ControllerSettings(
            addresses=("ctl-a:7400", "[::1]:7401", "10.0.0.3:65535"),
            server_name="controller.example",
            connect_timeout=1.5,
            request_timeout=7,
            heartbeat_interval=0.25,
            heartbeat_timeout=0.75,
            max_redirects=0,
            backoff=Backoff(initial=0.01, max=30, multiplier=3.5, jitter=0),
        ),
        tls=TlsPaths(ca=tmp / "ca.pem", cert=tmp / "p.pem", key=tmp / "p.key"),
        lease=LeaseSettings(margin=0),
        daemon=DaemonSettings(events_log=tmp / "ev.jsonl", admin_socket=tmp / "a.sock", log_level="debug"),
        providers=(
            ProviderConfig(
                "lsf",
                "oneshot",
                path=tmp / "plugin",
                conf_dir=tmp / "conf",
                data_dir=tmp / "data",
                max_machines=0,
                step_limit=100_000,
                join_deadline=86_400,
                idle_time=0,
                max_ttl=31_536_000,
                provisioning_timeout=0.5,
                timeouts=ProviderTimeouts(
                    default=1,
                    describe=2,
                    templates=3,
                    request=4,
                    status=5,
                    return_=6,
                    return_requests=7,
                    list=8,
                    stop=9,
                ),
                legacy=LegacyOptions(
                    mode="on",
                    user_data={"TOKEN": "{join_token}", "WHO": "{cluster}/{provider}"},
                    rc_account="acct",
                    journal=tmp / "journal.json",
                    max_ops=1,
                ),
                orphans=OrphanSettings(
                    action="terminate",
                    grace=0,
                    max_cleanup_per_interval=0,
                    protect_tag="keep",
                    dry_run=True,
                    ghost_confirmations=100,
                    breaker_max_failures=1,
                    breaker_max_share=1,
                    breaker_min_orphans=0,
                    interval=0.5,
                    settle=0,
                ),
                env={"API_KEY": "s3cr3t", "EMPTY": ""},
            ),
            ProviderConfig("cloud", "persistent", argv=("python3", "-u", "prov.py"), legacy=LegacyOptions(mode="off")),
            ProviderConfig("auto", "oneshot", path=tmp / "p2", legacy=LegacyOptions(mode="auto", rc_account="x")),
        ),
    )


def test_a_full_spec_round_trips_through_the_loader(tmp_path):
    spec = full(tmp_path)
    loaded = write_daemon_config(spec, tmp_path / "pd.toml")
    assert loaded == spec
    assert loaded.source == (tmp_path / "pd.toml").resolve()
    assert loaded == Config.from_file(tmp_path / "pd.toml")
    doc = tomllib.loads((tmp_path / "pd.toml").read_text(encoding="utf-8"))
    # The file speaks the file's vocabulary, not the Python field names.
    assert doc["providers"][0]["timeouts"]["return"] == 6 and "return_" not in doc["providers"][0]["timeouts"]
    assert [p.get("legacy", {}).get("mode") for p in doc["providers"]] == [True, False, None]  # "auto": default
    assert "source" not in doc


def test_a_minimal_spec_round_trips_and_writes_no_defaults(tmp_path):
    spec = minimal(tmp_path)
    loaded = write_daemon_config(spec, tmp_path / "pd.toml")
    assert loaded == spec
    assert loaded.lease.margin == 2.0 and loaded.provider("sim").timeouts.default == 60.0
    doc = tomllib.loads((tmp_path / "pd.toml").read_text(encoding="utf-8"))
    assert doc == {
        "cluster": "c1",
        "identity": "p1",
        "controller": {"addresses": ["ctl:7400"]},
        "tls": {
            "ca": str(tmp_path / "certs" / "ca.pem"),
            "cert": str(tmp_path / "certs" / "provisioner.pem"),
            "key": str(tmp_path / "certs" / "provisioner.key"),
        },
        "providers": [{"name": "sim", "transport": "oneshot", "path": str(tmp_path / "sim")}],
    }


def test_the_example_config_round_trips(tmp_path):
    example = Config.from_file(REPO / "docs" / "example-config.toml")
    assert write_daemon_config(example, tmp_path / "pd.toml") == example


def test_relative_paths_stay_relative_and_resolve_against_the_file(tmp_path):
    spec = attrs.evolve(minimal(tmp_path), tls=TlsPaths(Path("certs/ca.pem"), Path("p.pem"), Path("../k.key")))
    (tmp_path / "sub").mkdir()
    loaded = write_daemon_config(spec, tmp_path / "sub" / "pd.toml")
    assert tomllib.loads((tmp_path / "sub" / "pd.toml").read_text())["tls"]["key"] == "../k.key"
    assert loaded.tls == TlsPaths(tmp_path / "sub" / "certs" / "ca.pem", tmp_path / "sub" / "p.pem", tmp_path / "k.key")


def test_quotes_backslashes_unicode_and_control_characters_survive(tmp_path):
    odd_dir = tmp_path / ODD.replace("\n", " ")
    base = minimal(tmp_path)
    spec = attrs.evolve(
        base,
        controller=attrs.evolve(base.controller, server_name=ODD),
        providers=(
            ProviderConfig(
                "sim",
                "oneshot",
                path=odd_dir,
                env={"SECRET": ODD},
                legacy=LegacyOptions(user_data={"NOTE": ODD + " {join_token}"}, rc_account=ODD),
                orphans=OrphanSettings(protect_tag=ODD),
            ),
            ProviderConfig("p2", "persistent", argv=(ODD, "--flag=" + ODD)),
        ),
    )
    loaded = write_daemon_config(spec, tmp_path / "pd.toml")
    assert loaded == spec
    assert loaded.provider("sim").env["SECRET"] == ODD
    assert loaded.provider("p2").argv == (ODD, "--flag=" + ODD)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(max_size=200), word=st.text(min_size=1, max_size=60))
def test_any_text_survives(tmp_path, value, word):
    base = minimal(tmp_path)
    spec = attrs.evolve(
        base,
        providers=(
            ProviderConfig(
                "sim",
                "oneshot",
                path=tmp_path / "sim",
                env={"V": value},
                legacy=LegacyOptions(rc_account=word),
                orphans=OrphanSettings(protect_tag=word),
            ),
            ProviderConfig("p2", "persistent", argv=(word, word + value)),
        ),
    )
    # The loader's own text path (what from_file runs after reading); no file per example.
    assert Config.from_toml(daemon_config_toml(spec), base_dir=tmp_path) == spec


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda c: attrs.evolve(c, lease=LeaseSettings(margin=-1)), "lease.margin: -1 is less than the minimum of 0"),
        (lambda c: attrs.evolve(c, cluster="bad name\n"), "cluster: 'bad name\\n' does not match"),
        (lambda c: attrs.evolve(c, identity=None), "identity: is required but missing"),
        (lambda c: attrs.evolve(c, providers=c.providers * 2), "providers[1].name: duplicate provider name 'sim'"),
        (
            lambda c: attrs.evolve(
                c, providers=(ProviderConfig("p", "persistent", argv=("x",), legacy=LegacyOptions(mode="on")),)
            ),
            "providers[0].legacy: an LSF plugin is one-shot",
        ),
        (
            lambda c: attrs.evolve(
                c, providers=(ProviderConfig("p", "oneshot", path=Path("x"), legacy=LegacyOptions(mode="sometimes")),)
            ),
            "providers[0].legacy.mode: 'sometimes' is not one of",
        ),
        (
            lambda c: attrs.evolve(c, controller=ControllerSettings(("ctl:7400",), heartbeat_timeout=1)),
            "controller.heartbeat_timeout: 1 must be greater than heartbeat_interval",
        ),
    ],
)
def test_a_value_the_loader_refuses_raises_its_config_error_and_writes_nothing(tmp_path, change, problem):
    path = tmp_path / "pd.toml"
    with pytest.raises(ConfigError) as caught:
        write_daemon_config(change(minimal(tmp_path)), path)
    assert any(line.startswith(problem) for line in caught.value.problems), caught.value.problems
    assert str(path) in str(caught.value)
    assert os.listdir(tmp_path) == []  # neither the file nor a temporary one


def test_a_refused_value_keeps_the_previous_file_and_never_repeats_a_credential(tmp_path):
    path = tmp_path / "pd.toml"
    write_daemon_config(minimal(tmp_path), path)
    before = path.read_bytes()
    bad = attrs.evolve(
        minimal(tmp_path),
        providers=(ProviderConfig("sim", "oneshot", path=Path("x"), env={"TOKEN": "hunter2-" + "x" * 70_000}),),
    )
    with pytest.raises(ConfigError) as caught:
        write_daemon_config(bad, path)
    assert caught.value.problems == (
        "providers[0].env.TOKEN: value hidden: fails the 'maxLength' check "
        "(expected a string of at most 65536 characters)",
    )
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(bad)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["pd.toml"]


def test_the_file_is_replaced_whole_and_private(tmp_path):
    path = tmp_path / "pd.toml"
    path.write_text("old and readable by all\n")
    path.chmod(0o644)
    write_daemon_config(full(tmp_path), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a provider's env holds credentials
    assert sorted(os.listdir(tmp_path)) == ["pd.toml"]
    assert write_daemon_config(minimal(tmp_path), path) == minimal(tmp_path)


def test_an_unwritable_place_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot write config"):
        write_daemon_config(minimal(tmp_path), tmp_path / "missing-dir" / "pd.toml")


def test_provisioner_tls_names_the_files_certs_init_writes(tmp_path):
    from provisionerd.pki.certs import init_certs

    written = set(init_certs(tmp_path / "certs", "c1"))
    tls = provisioner_tls(tmp_path / "certs")
    assert {tls.ca, tls.cert, tls.key} <= written
    assert (tls.cert.name, tls.key.name) == ("provisioner.pem", "provisioner.key")
