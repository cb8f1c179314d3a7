"""The one-shot transport against real plugin processes (real clock)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from provisionerd.domain.errors import (
    ProviderCrashed,
    ProviderFailed,
    ProviderInputInvalid,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnsupported,
    QuotaExceeded,
)
from provisionerd.provider.oneshot import OneShotProvider

pytestmark = pytest.mark.process


@pytest.fixture
def plugin(tmp_path: Path, make_config, h) -> OneShotProvider:
    return OneShotProvider(make_config(h.oneshot_dir(tmp_path / "plugin", "scripted.py")))


def call(client, action, doc, **kw):
    return trio.run(lambda: client.call(action, doc, **kw))


def test_valid_answer_is_returned(plugin, h):
    out = call(plugin, "getRequestStatus", h.status_input("ok:r1"))
    assert [m["machineId"] for m in out["requests"][0]["machines"]] == ["r1-m0", "r1-m1"]


def test_timeout_kills_the_whole_group_including_a_grandchild(plugin, data_dir, h):
    started = time.monotonic()
    with pytest.raises(ProviderTimeout) as info:
        call(plugin, "getRequestStatus", h.status_input("hang-with-child"), timeout=1.5)
    assert time.monotonic() - started < 5
    assert "killed" in str(info.value)
    grandchild = int((data_dir / "grandchild.pid").read_text())
    assert h.is_dead(grandchild), f"grandchild {grandchild} survived the timeout"


def test_cancel_kills_the_whole_group(plugin, data_dir, h):
    async def main():
        with trio.move_on_after(1.5):
            await plugin.call("getRequestStatus", h.status_input("hang-with-child"))
        return int((data_dir / "grandchild.pid").read_text())

    assert h.is_dead(trio.run(main))


def test_crash_is_typed_with_the_stderr_tail(plugin, h):
    with pytest.raises(ProviderCrashed) as info:
        call(plugin, "getRequestStatus", h.status_input("crash"))
    assert "status 3" in str(info.value) and "about to crash" in str(info.value)


def test_oversize_output_is_a_protocol_violation(plugin, h):
    with pytest.raises(ProviderProtocolViolation, match="exceeds"):
        call(plugin, "getRequestStatus", h.status_input("big"))


def test_non_json_output_is_a_protocol_violation(plugin, h):
    with pytest.raises(ProviderProtocolViolation, match="not JSON"):
        call(plugin, "getRequestStatus", h.status_input("garbage"))


def test_output_failing_the_schema_is_a_typed_violation(plugin, h):
    with pytest.raises(ProviderProtocolViolation, match=r"\$\.requests\[0\]\.status"):
        call(plugin, "getRequestStatus", h.status_input("bad-output"))


def test_error_document_becomes_rejected_with_its_code(plugin, h):
    with pytest.raises(ProviderRejected) as info:
        call(plugin, "getRequestStatus", h.status_input("reject"))
    assert info.value.code == "quota_exceeded" and not info.value.retryable and not info.value.outcome_unknown
    assert type(info.value) is QuotaExceeded


def test_plain_message_on_failure_is_provider_error(plugin, h):
    with pytest.raises(ProviderRejected) as info:
        call(plugin, "getRequestStatus", h.status_input("plain-fail"))
    assert info.value.code == "provider_error" and "went wrong" in info.value.message
    assert type(info.value) is ProviderFailed


def test_bad_input_is_rejected_before_any_process_starts(tmp_path, make_config, h):
    marker = tmp_path / "ran"
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    script = plugin_dir / "getRequestStatus.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{}}'\n")
    script.chmod(0o755)
    client = OneShotProvider(make_config(plugin_dir))
    with pytest.raises(ProviderInputInvalid) as info:
        call(client, "getRequestStatus", {"requests": []})
    assert info.value.code == "invalid_request" and "$.requests" in str(info.value)
    assert not marker.exists()


def test_missing_action_script_is_unsupported(tmp_path, make_config, h):
    client = OneShotProvider(make_config(h.oneshot_dir(tmp_path / "p", "scripted.py", actions=["getRequestStatus"])))
    with pytest.raises(ProviderUnsupported):
        call(client, "describeProvider", {})


def test_credentials_reach_the_plugin_but_never_the_error(tmp_path, make_config, h):
    secret = "AKIA-very-secret-value-123"
    client = OneShotProvider(
        make_config(h.oneshot_dir(tmp_path / "p", "scripted.py"), credentials={"SECRET_KEY": secret})
    )
    with pytest.raises(ProviderRejected) as info:
        call(client, "getRequestStatus", h.status_input("leak"))
    text = str(info.value) + repr(info.value) + info.value.message
    assert "auth failed with key ***" in text  # the plugin did get the value, and we hid it
    assert secret not in text


def test_private_workdir_and_input_file(tmp_path, make_config, h):
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    report = tmp_path / "report"
    script = plugin_dir / "getAvailableTemplates.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'stat -c "%a" "$2" > {report}; stat -c "%a" . >> {report}; pwd >> {report}\n'
        'env | grep -E "^(PROVIDER_NAME|PRO_CONF_DIR|PRO_DATA_DIR|PROVISIONERD_CLUSTER|PROVISIONERD_PYTHON)="'
        f" | sort >> {report}\n"
        "echo '{\"templates\": []}'\n"
    )
    script.chmod(0o755)
    client = OneShotProvider(make_config(plugin_dir))
    assert call(client, "getAvailableTemplates", {}) == {"templates": []}
    lines = report.read_text().splitlines()
    assert lines[0] == "600" and lines[1] == "700"
    assert not os.path.exists(lines[2]), "the private workdir must be removed after the call"
    assert "PROVIDER_NAME=test" in lines and "PROVISIONERD_CLUSTER=c1" in lines
