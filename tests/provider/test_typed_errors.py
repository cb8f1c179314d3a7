"""The typed provider errors: one class per contract code, chosen in one place, whoever raises."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisionerd.domain.errors import (
    PROVIDER_ERROR_CODES,
    REJECTIONS,
    RETRYABLE_CODES,
    AuthFailed,
    CapacityUnavailable,
    InvalidRequest,
    OutcomeUnknown,
    ProviderCrashed,
    ProviderError,
    ProviderFailed,
    ProviderInputInvalid,
    ProviderOutcomeUnknown,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnsupported,
    QuotaExceeded,
    Throttled,
    rejection,
)
from provisionerd.provider.runtime import read_error_body
from provisionerd.telemetry.redaction import Redactor

CLASSES = {
    "capacity_unavailable": CapacityUnavailable,
    "throttled": Throttled,
    "quota_exceeded": QuotaExceeded,
    "invalid_request": InvalidRequest,
    "auth_failed": AuthFailed,
    "provider_error": ProviderFailed,
}


@pytest.mark.parametrize("code", PROVIDER_ERROR_CODES)
def test_each_code_is_its_own_class(code):
    error = rejection("p", "requestMachines", code, "no")
    assert type(error) is CLASSES[code] and REJECTIONS[code] is CLASSES[code]
    assert error.code == code and isinstance(error, ProviderRejected)
    assert error.retryable == (code in RETRYABLE_CODES) and not error.outcome_unknown
    assert (error.provider, error.action, error.message) == ("p", "requestMachines", "no")
    assert str(error) == f"provider 'p' requestMachines: {code}: no" and error.detail == f"{code}: no"


def test_the_base_class_called_with_a_code_builds_that_codes_class():
    # As OSError(errno.ENOENT, ...) is a FileNotFoundError: a refusal's class always says its code.
    error = ProviderRejected("p", "requestMachines", "throttled", "slow down")
    assert type(error) is Throttled and error.retryable and error.message == "slow down"
    with pytest.raises(Throttled):
        raise ProviderRejected("p", "getAvailableTemplates", "throttled", "x")
    direct = Throttled("p", "requestMachines", "slow down")
    assert (type(direct), direct.code, str(direct)) == (Throttled, "throttled", str(error))


@given(st.text(max_size=20).filter(lambda c: c not in PROVIDER_ERROR_CODES))
def test_a_code_the_contract_does_not_know_is_provider_failed(code):
    error = rejection("p", "requestMachines", code, "api said no")
    assert type(error) is ProviderFailed and error.code == "provider_error" and not error.retryable
    assert type(ProviderRejected("p", "a", code, "m")) is ProviderFailed


def test_an_invalid_input_is_an_invalid_request_with_its_problems():
    error = ProviderInputInvalid("p", "listMachines", ["$.tags: required"])
    assert isinstance(error, InvalidRequest) and error.code == "invalid_request" and not error.retryable
    assert error.problems == ("$.tags: required",) and "input fails the schema: $.tags: required" in str(error)


def test_the_unknown_outcomes_share_a_base_and_the_flag():
    for cls in (ProviderTimeout, ProviderCrashed, ProviderProtocolViolation, ProviderOutcomeUnknown):
        error = cls("p", "requestMachines", "d")
        assert isinstance(error, OutcomeUnknown) and error.outcome_unknown and not isinstance(error, ProviderRejected)
    unsupported = ProviderUnsupported("p", "stopMachines", "no script")
    assert not isinstance(unsupported, OutcomeUnknown) and not unsupported.outcome_unknown
    assert all(issubclass(cls, ProviderError) for cls in (OutcomeUnknown, ProviderRejected, ProviderUnsupported))


@pytest.mark.parametrize("code", PROVIDER_ERROR_CODES)
def test_an_error_document_becomes_its_codes_class(code):
    body = {"code": code, "message": "why s3cr3t-v", "retryable": code in RETRYABLE_CODES}
    error = read_error_body("p", "requestMachines", body, Redactor(frozenset({"s3cr3t-v"})))
    assert type(error) is CLASSES[code] and error.message == "why ***"
    assert read_error_body("p", "requestMachines", {"code": "nonsense", "message": "x"}, Redactor()) is None


def test_a_contradicting_retryable_flag_is_noted_not_obeyed():
    error = read_error_body("p", "a", {"code": "quota_exceeded", "message": "m", "retryable": True}, Redactor())
    assert type(error) is QuotaExceeded and not error.retryable
    assert error.__notes__ == ["the plugin said retryable=True for code 'quota_exceeded'"]
