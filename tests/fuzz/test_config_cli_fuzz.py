"""Fuzzing the config loader and the command line.

``Config.from_toml`` / ``from_document`` / ``from_file`` either return a ``Config`` or raise ``ConfigError`` (with
its problems), on any text or document, within bounded memory. ``provisionerd.cli.main`` returns an exit code for
any argv of the subcommands that parse without side effects (``config check``, argument errors of ``provider
check`` and ``simulate``, unknown commands, help) and never raises; none of these argvs can reach the network or
start a process (``provider check`` never gets a PATH, ``simulate`` never gets valid numbers).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisionerd.cli import main as cli
from provisionerd.config.loader import MAX_CONFIG_BYTES, Config
from provisionerd.domain.errors import ConfigError

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE = Path("/nonexistent-base")

GOOD = """
cluster = "c1"
identity = "prov-a"
[controller]
addresses = ["ctl0:7400"]
[tls]
ca = "ca.pem"
cert = "cert.pem"
key = "key.pem"
[[providers]]
name = "sim"
transport = "persistent"
argv = ["/bin/true"]
"""

toml_keys = st.sampled_from(
    [
        "cluster",
        "identity",
        "addresses",
        "providers",
        "name",
        "transport",
        "timeouts",
        "max_machines",
        "margin",
        "backoff",
        "initial",
        "env",
        "orphans",
        "x",
    ]
)
toml_values = st.one_of(
    st.integers(-(2**65), 2**65).map(str),
    st.floats(allow_nan=True).map(lambda f: repr(f).replace("inf", "inf")),
    st.text(max_size=10).map(lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'),
    st.sampled_from(["true", "[]", "{}", '["a", 1]', "1979-05-27T07:32:00Z", '"""x"""', "nan"]),
)
toml_lines = st.one_of(
    st.builds(lambda k, v: f"{k} = {v}", toml_keys, toml_values),
    st.sampled_from(["[controller]", "[tls]", "[[providers]]", "[providers.timeouts]", "[lease]", "[daemon]", "["]),
    st.text(max_size=30),
)


def loads(text: str) -> Config | ConfigError:
    try:
        return Config.from_toml(text, base_dir=BASE)
    except ConfigError as exc:
        assert exc.problems or str(exc)
        return exc


def test_the_good_config_loads():
    assert isinstance(loads(GOOD), Config)


@FUZZ
@given(st.lists(toml_lines, max_size=12), st.booleans())
def test_toml_like_text_gives_a_config_or_a_config_error(lines, start_good):
    text = (GOOD if start_good else "") + "\n".join(lines)
    assert isinstance(loads(text), (Config, ConfigError))


@FUZZ
@given(st.integers(0, 20), st.text(max_size=20))
def test_a_mutilated_good_config_gives_a_config_or_a_config_error(cut, insert):
    lines = GOOD.splitlines()
    text = "\n".join(lines[:cut] + [insert] + lines[cut + 1 :])
    assert isinstance(loads(text), (Config, ConfigError))


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.one_of(toml_keys, st.text(max_size=6)), inner, max_size=5)
    ),
    max_leaves=30,
)


@FUZZ
@given(json_like)
def test_any_document_gives_a_config_or_a_config_error(doc):
    try:
        result = Config.from_document(doc, base_dir=BASE)
    except ConfigError:
        return
    assert isinstance(result, Config)


def test_a_huge_config_file_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_bytes(b"# " + b"x" * (20 * MAX_CONFIG_BYTES))
    tracemalloc.start()
    try:
        try:
            Config.from_file(path)
        except ConfigError as exc:
            error = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "larger than" in " ".join(error.problems)
    assert peak < 3 * MAX_CONFIG_BYTES


# --- the command line -----------------------------------------------------------------------------------------

words = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
flags = st.builds(lambda w: "--" + w, words)


def run_cli(argv: list[str]) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own exit (``provider check`` lets it through): a clean exit too
            code = exc.code
    assert isinstance(code, int)
    return code


@FUZZ
@given(
    st.one_of(
        st.lists(words, max_size=4),  # unknown commands and help words
        st.lists(flags, max_size=4).map(lambda a: ["provider", "check", *a]),  # never a PATH: argparse stops it
        st.lists(flags | words, max_size=4).map(lambda a: ["config", *a]),
        st.lists(flags, max_size=3).map(lambda a: ["simulate", "--seeds", "x", *a]),  # not a number: refused
    )
)
def test_any_argv_gives_an_exit_code(argv):
    if argv and argv[0] not in cli.COMMANDS or argv[:1] in (["config"], ["provider"], ["simulate"]):
        if argv[:1] == ["config"] and len(argv) >= 3 and argv[1] == "check":
            argv = ["config", "check", str(Path(tempfile.gettempdir()) / "provisionerd-fuzz-missing" / argv[2])]
        assert run_cli(argv) in (0, 1, 2)


@FUZZ
@given(st.text(max_size=300))
def test_config_check_on_any_file_content_gives_an_exit_code(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
        assert run_cli(["config", "check", str(path)]) in (1, 2)


@FUZZ
@given(st.lists(flags, max_size=4))
def test_provider_check_returns_a_code_for_bad_arguments_instead_of_exiting(extra):
    """``provider check`` without a PATH (and with any flags) is refused with 2 by ``main``; argparse's
    ``SystemExit`` used to escape it."""
    from provisionerd.cli import provider as check_cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = check_cli.main(["check", *[f for f in extra if f not in ("--help", "--h", "--he", "--hel")]])
    assert code == 2
    assert err.getvalue()  # it said why


def test_provider_check_help_returns_0():
    from provisionerd.cli import provider as check_cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert check_cli.main(["check", "--help"]) == 0
        assert check_cli.main(["--help"]) == 0
    assert "PATH" in out.getvalue()
