"""The human log in both formats (``provisionerd.telemetry.logging_setup``): JSON lines, and one redaction."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from provisionerd.cli.logs import setup_daemon_logging
from provisionerd.config.loader import Config, ControllerSettings, DaemonSettings, ProviderConfig, TlsPaths
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.logging_setup import configure_logging
from provisionerd.telemetry.redaction import Redactor

SECRET = "AKIA-very-secret-credential-0123456789"


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def config(log_format: str = "text") -> Config:
    return Config(
        cluster="c",
        identity="p",
        controller=ControllerSettings(("127.0.0.1:1",)),
        tls=TlsPaths(Path("ca"), Path("cert"), Path("key")),
        daemon=DaemonSettings(log_format=log_format),
        providers=(ProviderConfig("ec2", "oneshot", path=Path("x"), env={"AWS_SECRET_ACCESS_KEY": SECRET}),),
    )


def emit_everything(events: EventLog) -> None:
    """A plain line, an event with structured fields, a line quoting the secret, an event field holding it, and
    an exception whose message holds it (a secret with a quote in it also shows JSON-escaped)."""
    logging.getLogger("provisionerd.test").warning("plain %s", "line")
    events.emit("lease_acquired", provider="ec2", epoch=Epoch(3, 1), machines=("m1", "m2"), level="clash")
    logging.getLogger("provisionerd.test").error("the plugin said %s", SECRET)
    events.emit("provider_failed", provider="ec2", detail=f"env AWS_SECRET_ACCESS_KEY={SECRET}")
    try:
        raise RuntimeError(f"boom {SECRET}")
    except RuntimeError:
        logging.getLogger("provisionerd.test").exception("failed")


def test_json_lines_carry_level_logger_event_and_fields():
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    emit_everything(EventLog())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 5  # one object per line: the traceback is inside its object
    plain, event = lines[0], lines[1]
    assert plain["level"] == "warning" and plain["logger"] == "provisionerd.test" and plain["message"] == "plain line"
    assert plain["ts"].endswith("Z") and "T" in plain["ts"] and "event" not in plain
    assert event["event"] == "lease_acquired" and event["logger"] == "provisionerd.events"
    assert event["provider"] == "ec2" and event["epoch"] == "3.1" and event["machines"] == ["m1", "m2"]
    assert event["level"] == "info" and event["level_"] == "clash"  # a field never overwrites a line's own key
    assert "Traceback" in lines[4]["exc"] and "RuntimeError" in lines[4]["exc"]


def test_text_stays_the_default():
    out = io.StringIO()
    configure_logging("info", stream=out)
    logging.getLogger("provisionerd.test").info("hello")
    assert out.getvalue().rstrip().endswith("INFO provisionerd.test: hello")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_credential_never_reaches_either_format(fmt, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    setup_daemon_logging(config(), fmt)  # --log-format fmt over the config's text
    emit_everything(EventLog())
    text = out.getvalue()
    assert SECRET not in text
    assert text.count("***") >= 3
    if fmt == "json":
        assert all(json.loads(line) for line in text.splitlines())


def test_the_config_key_picks_the_format_and_the_flag_wins(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    setup_daemon_logging(config("json"), None)
    logging.getLogger("provisionerd.test").info("x")
    assert json.loads(out.getvalue())["message"] == "x"
    setup_daemon_logging(config("json"), "text")  # replaces the handler it installed, not the others
    logging.getLogger("provisionerd.test").info("y")
    assert out.getvalue().splitlines()[-1].endswith("provisionerd.test: y")
    assert sum(type(h).__name__ == "_DaemonHandler" for h in logging.getLogger().handlers) == 1


def test_a_json_escaped_secret_is_redacted_too():
    quoted = 'pa"ss\\word-with-quote'
    out = io.StringIO()
    configure_logging("info", "json", stream=out, redact=Redactor().including([quoted]))
    EventLog().emit("x", detail=quoted)
    assert "pa" not in out.getvalue().replace("provisionerd", "")
    assert json.loads(out.getvalue())["detail"] == "***"


def test_bad_format_or_level_is_refused():
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud", "json")
