"""Config: schema first (every problem with its path), then frozen values; secrets never shown."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from provisionerd.cli import main as cli
from provisionerd.config.loader import Config
from provisionerd.config.problems import find_problems, format_path
from provisionerd.domain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "example-config.toml"

GOOD = textwrap.dedent(
    """
    cluster = "c1"
    identity = "p1"
    [controller]
    addresses = ["ctl-a:7400", "[::1]:7401"]
    [tls]
    ca = "certs/ca.pem"
    cert = "/etc/pd/p.pem"
    key = "certs/p.key"
    [[providers]]
    name = "sim"
    transport = "oneshot"
    path = "plugins/sim"
    timeouts = {default = 30, request = 90}
    env = {API_KEY = "s3cr3t-value", REGION = "eu-1"}
    """
)


def load(text: str, tmp_path: Path) -> Config:
    path = tmp_path / "pd.toml"
    path.write_text(text)
    return Config.from_file(path)


def test_a_good_config_becomes_frozen_values_with_defaults_and_resolved_paths(tmp_path):
    config = load(GOOD, tmp_path)
    assert config.controller.addresses == ("ctl-a:7400", "[::1]:7401")
    assert config.controller.heartbeat_timeout == 6.0 and config.lease.margin == 2.0
    assert config.tls.ca == tmp_path / "certs" / "ca.pem"
    assert config.tls.cert == Path("/etc/pd/p.pem")
    sim = config.provider("sim")
    assert sim.path == tmp_path / "plugins" / "sim"
    assert sim.timeouts.for_action("requestMachines") == 90.0
    assert sim.timeouts.for_action("listMachines") == 30.0
    assert sim.env["API_KEY"] == "s3cr3t-value"
    with pytest.raises(TypeError):
        sim.env["API_KEY"] = "x"  # type: ignore[index]
    assert config.source == (tmp_path / "pd.toml").resolve()


def test_repr_redacts_provider_credentials(tmp_path):
    config = load(GOOD, tmp_path)
    for text in (repr(config), str(config), repr(config.providers)):
        assert "s3cr3t-value" not in text and "eu-1" not in text
        assert "'API_KEY': '***'" in text


def test_several_problems_are_reported_at_once_with_their_paths(tmp_path):
    bad = textwrap.dedent(
        """
        cluster = "c 1"
        identity = "p1"
        surprise = true
        [controller]
        addresses = ["ctl-a:7400", "ctl-b", "ctl-c:70000"]
        heartbeat_interval = 5
        heartbeat_timeout = 5
        [tls]
        ca = "ca.pem"
        cert = "p.pem"
        [[providers]]
        name = "sim"
        transport = "oneshot"
        path = "x"
        [[providers]]
        name = "sim"
        transport = "bogus"
        timeouts = {request = -3}
        orphans = {action = "delete"}
        """
    )
    with pytest.raises(ConfigError) as info:
        load(bad, tmp_path)
    problems = info.value.problems
    assert list(problems) == [
        "cluster: 'c 1' does not match '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'",
        "controller.addresses[1]: 'ctl-b' does not match '^(\\\\[[0-9A-Fa-f:.]+\\\\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$'",
        "controller.addresses[2]: port 70000 is out of range 1-65535",
        "controller.heartbeat_timeout: 5 must be greater than heartbeat_interval (5), or every link looks dead",
        "providers[1].name: duplicate provider name 'sim' (also providers[0])",
        "providers[1].orphans.action: 'delete' is not one of ['report', 'stop', 'terminate']",
        "providers[1].timeouts.request: -3 is less than or equal to the minimum of 0",
        "providers[1].transport: 'bogus' is not one of ['oneshot', 'persistent']",
        "surprise: unknown key",
        "tls.key: is required but missing",
    ]
    assert str(info.value).count("\n") == len(problems)


def test_problems_inside_env_never_show_the_value(tmp_path):
    bad = GOOD.replace('env = {API_KEY = "s3cr3t-value", REGION = "eu-1"}', 'env = {API_KEY = 31337, "bad-name" = "x"}')
    bad += '\n[[providers]]\nname = "p2"\ntransport = "persistent"\nargv = ["p"]\nenv = "TOKEN=hunter2"\n'
    with pytest.raises(ConfigError) as info:
        load(bad, tmp_path)
    text = str(info.value)
    assert "31337" not in text and "hunter2" not in text
    assert list(info.value.problems) == [
        "providers[0].env: key 2 (of 2, in file order; not shown: an env key may be a secret by mistake) is not a "
        "valid name (letters, digits and _; not starting with a digit)",
        "providers[0].env.API_KEY: value hidden: fails the 'type' check "
        "(expected a string of at most 65536 characters)",
        "providers[1].env: value hidden: fails the 'type' check (expected a table of strings)",
    ]


def test_an_env_key_that_is_not_a_name_is_never_echoed(tmp_path):
    # A secret pasted as a key (issue 16): neither its name problem nor its value's problem shows its text.
    secret = "sk-live-4f9a8b7c6d5e"
    bad = GOOD.replace(
        'env = {API_KEY = "s3cr3t-value", REGION = "eu-1"}', f'env = {{REGION = "eu-1", "{secret}" = 7}}'
    )
    with pytest.raises(ConfigError) as info:
        load(bad, tmp_path)
    assert secret not in str(info.value) and "4f9a" not in str(info.value)
    assert list(info.value.problems) == [
        "providers[0].env: key 2 (of 2, in file order; not shown: an env key may be a secret by mistake) is not a "
        "valid name (letters, digits and _; not starting with a digit)",
        "providers[0].env: the value of key 2 (of 2, in file order; not shown: an env key may be a secret by mistake): "
        "value hidden: fails the 'type' check (expected a string of at most 65536 characters)",
    ]


def test_a_whole_table_is_never_printed_in_a_message(tmp_path):
    bad = GOOD.replace("[[providers]]", 'providers = "x"\n[[xproviders]]', 1)
    doc_problems = find_problems(
        {
            "cluster": "c",
            "identity": "i",
            "controller": {"addresses": ["a:1"]},
            "tls": {"ca": "a", "cert": "b", "key": "c"},
            "providers": [
                {"name": "s", "transport": "oneshot", "path": "p", "timeouts": {"default": {"secret": "zzz"}}}
            ],
        }
    )
    assert doc_problems == ["providers[0].timeouts.default: a table is not of type 'number'"]
    with pytest.raises(ConfigError):
        load(bad, tmp_path)


def test_transport_rules(tmp_path):
    both = GOOD.replace('path = "plugins/sim"', 'path = "plugins/sim"\nargv = ["x"]')
    with pytest.raises(ConfigError) as info:
        load(both, tmp_path)
    assert list(info.value.problems) == [
        "providers[0].argv: only a 'persistent' provider takes argv (oneshot uses path)"
    ]
    neither = GOOD.replace('transport = "oneshot"\npath = "plugins/sim"', 'transport = "persistent"')
    with pytest.raises(ConfigError) as info:
        load(neither, tmp_path)
    assert list(info.value.problems) == ["providers[0]: a 'persistent' provider needs exactly one of path or argv"]


def test_unreadable_and_non_toml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        Config.from_file(tmp_path / "missing.toml")
    with pytest.raises(ConfigError) as info:
        load('cluster = "a"\nidentity = = 1\n', tmp_path)
    assert info.value.problems[0].startswith("(file): ") and "line 2" in info.value.problems[0]
    (tmp_path / "big.toml").write_bytes(b"#" * (1 << 20) + b"\n" * 10)
    with pytest.raises(ConfigError, match="larger than"):
        Config.from_file(tmp_path / "big.toml")


def test_format_path():
    assert format_path(["providers", 1, "timeouts", "request"]) == "providers[1].timeouts.request"
    assert format_path([]) == "(top level)"
    assert format_path(["providers", 0, "env", "weird key"]) == 'providers[0].env["weird key"]'


def test_the_example_config_passes():
    config = Config.from_file(EXAMPLE)
    assert config.provider_names == ("sim", "cloud")
    assert "example-not-a-real-key" not in repr(config)


def test_config_check_cli(tmp_path, capsys):
    assert cli.main(["config", "check", "--document-only", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "provider 'cloud'" in out and "example-not-a-real-key" not in out
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("[tls]", "[tls]\nextra = 1").replace('API_KEY = "s3cr3t-value"', "API_KEY = 5"))
    assert cli.main(["config", "check", str(bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[1:3] == [
        f"{bad}: providers[0].env.API_KEY: value hidden: fails the 'type' check "
        "(expected a string of at most 65536 characters)",
        f"{bad}: tls.extra: unknown key",
    ]
    # The later stages ran on the rest: the plugin path and TLS files this file names do not exist here.
    assert any(line.startswith(f"{bad}: providers[0].path: ") for line in err[3:])
    assert any(line.startswith(f"{bad}: tls.ca: ") for line in err[3:])
    assert err[0] == f"{bad}: {len(err) - 1} problem(s)"
    assert cli.main(["config"]) == 2
