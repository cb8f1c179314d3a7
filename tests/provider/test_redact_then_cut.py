"""Redact, then truncate (issue 16): a secret at any offset of a plugin's stderr, across every cut, leaves no
fragment in an error detail. A cut made before redaction left 40 of a token's 43 characters behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from provisionerd.domain.errors import ProviderCrashed
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import Backoff, open_persistent_provider
from provisionerd.provider.process import StderrTail
from provisionerd.provider.runtime import Limits, snippet
from provisionerd.telemetry.redaction import Redactor

TOKEN = "tok-Zq8RvW3xK9mN2pL7yT4cB6hJ1dF5gS0aE8uQ3iO"  # 43 characters, as in the issue
PEM = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQE\n-----END KEY-----"  # a credential with newlines
FRAGMENT = 5  # no run of this many of a secret's characters may survive


def fragments(secret: str, text: str) -> list[str]:
    return [secret[i : i + FRAGMENT] for i in range(len(secret) - FRAGMENT + 1) if secret[i : i + FRAGMENT] in text]


def padded(total: int, at: int, secret: str) -> str:
    """``total`` characters of dotted lines with ``secret`` starting at ``at``."""
    pad = "".join("\n" if i % 16 == 15 else "." for i in range(total - len(secret)))
    return pad[:at] + secret + pad[at:]


# --- the tail alone: every offset, several chunkings ---------------------------------------------------------------


@pytest.mark.parametrize("secret", [TOKEN, PEM], ids=["token", "pem"])
def test_the_tail_redacts_before_every_cut(secret):
    redact = Redactor(frozenset({secret}))
    total, limit = 300, 64
    checked = 0
    for at in range(total - len(secret) + 1):
        data = padded(total, at, secret).encode()
        for size in (1, 7, 64, 4096):
            tail = StderrTail(limit, lambda: redact)
            for i in range(0, len(data), size):
                tail.feed(data[i : i + size])
            for quote in (limit, 20, 1):
                text = tail.text(quote)
                assert len(text) <= quote
                assert not fragments(secret, text), (at, size, quote, text)
                checked += 1
            assert len(tail._text) <= 2 * limit + size  # bounded while feeding
    assert checked == (total - len(secret) + 1) * 4 * 3


def test_a_secret_longer_than_the_tail_is_kept_whole_until_redacted():
    secret = "L" * 10 + "ong-secret-" + "x" * 100  # 121 characters, the tail keeps 16
    redact = Redactor(frozenset({secret}))
    tail = StderrTail(16, lambda: redact)
    for ch in ("." * 40 + secret + "." * 3).encode():
        tail.feed(bytes([ch]))
    assert not fragments(secret, tail.text())


def test_a_character_split_between_chunks_is_decoded_whole():
    tail = StderrTail(64)
    data = "grüße €\n".encode()
    for i in range(len(data)):
        tail.feed(data[i : i + 1])
    assert tail.text() == "grüße €"


def test_a_bytes_snippet_redacts_before_it_cuts():
    # 199 four-byte characters, then the secret: the old cut at 4 * limit bytes left the secret's first character.
    secret = "Sx7-secret"
    text = ("\U0001f600" * 199 + secret).encode()
    assert "S" not in snippet(text, Redactor(frozenset({secret})))


# --- both transports, end to end ----------------------------------------------------------------------------------

ONESHOT = """#!/bin/sh
printf '%s%s%s' "$PAD_BEFORE" "$SECRET_KEY" "$PAD_AFTER" >&2
exit 1
"""
PERSISTENT = """#!/bin/sh
printf '%s%s%s' "$PAD_BEFORE" "$SECRET_KEY" "$PAD_AFTER" >&2
read line
exit 1
"""
# (total stderr characters, the config's stderr_tail, the secret's start offsets). First: the 1,000-character
# quote of a default tail, every offset at which the secret straddles it (the case); then a tail of 64
# characters over the whole stream (trims while reading, and the final cut).
CASES = [(1100, Limits().stderr_tail, range(100 - 50, 100 + 2)), (200, 64, None)]


def cases(secret):
    for total, tail, offsets in CASES:
        for at in offsets if offsets is not None else range(total - len(secret) + 1):
            yield total, tail, at


@pytest.mark.process
@pytest.mark.parametrize("transport", ["oneshot", "persistent"])
@pytest.mark.parametrize("secret", [TOKEN, PEM], ids=["token", "pem"])
def test_a_secret_at_every_offset_of_stderr_leaves_no_fragment(tmp_path: Path, make_config, h, transport, secret):
    if transport == "oneshot":
        path = tmp_path / "p"
        path.mkdir()
        h.write_executable(path / "getRequestStatus.sh", ONESHOT)
    else:
        path = h.write_executable(tmp_path / "provider", PERSISTENT)

    async def one(total: int, tail: int, at: int) -> str:
        text = padded(total, at, secret)
        start = text.index(secret)
        env = {"PAD_BEFORE": text[:start], "PAD_AFTER": text[start + len(secret) :]}
        config = make_config(
            path,
            transport=transport,
            env=env,
            credentials={"SECRET_KEY": secret},
            limits=Limits(term_grace=0.3, stderr_tail=tail),
        )
        if transport == "oneshot":
            with pytest.raises(ProviderCrashed) as info:
                await OneShotProvider(config).call("getRequestStatus", h.status_input("r"))
            return str(info.value)
        async with open_persistent_provider(config, backoff=Backoff(initial=60)) as client:
            with pytest.raises(ProviderCrashed) as info:
                await client.call("getRequestStatus", h.status_input("r"))
            return str(info.value)

    async def main() -> int:
        runs = 0
        for total, tail, at in cases(secret):
            detail = await one(total, tail, at)
            assert "stderr tail: '" in detail, detail  # the tail was quoted: the check below means something
            assert not fragments(secret, detail), (total, tail, at, detail)
            runs += 1
        return runs

    assert trio.run(main) == sum(1 for _ in cases(secret))
