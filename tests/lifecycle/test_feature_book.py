"""The feature book (``execution.provider_features``) on trio's MockClock: a ``describeProvider`` that fails is
not asked again at every pass, but after a pause that doubles for each failure in a row (10 s, 20 s, ... 300 s);
the first success is kept and the pauses forgotten."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from provisionerd.domain.errors import ProviderCrashed
from provisionerd.execution.provider_features import RETRY_FIRST, RETRY_MOST, FeatureBook
from provisionerd.provider.values import Features


class Flaky:
    """A client whose ``describeProvider`` fails ``failures`` times, then declares all-or-nothing."""

    known_features = None

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked: list[float] = []

    async def describe_provider(self, **_: Any) -> Any:
        self.asked.append(trio.current_time())
        if len(self.asked) <= self.failures:
            raise ProviderCrashed("p", "describeProvider", "exited 1 before answering")
        return SimpleNamespace(features=Features(all_or_nothing=True))


def reads_every_second(book: FeatureBook, seconds: int) -> list[Features | None]:
    async def main() -> list[Features | None]:
        answers = []
        for _ in range(seconds):
            answers.append(await book.read("p"))
            await trio.sleep(1.0)
        return answers

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_failing_describe_provider_is_asked_after_pauses_that_double_then_kept_once_it_answers() -> None:
    client = Flaky(failures=3)
    book = FeatureBook({"p": client})  # type: ignore[dict-item]
    answers = reads_every_second(book, 120)
    # Asked at 0 (fails), 10 (fails), 30 (fails), 70 (answers); a read a second in between asks nothing.
    assert client.asked == [0.0, 10.0, 30.0, 70.0]
    assert answers[69] is None and answers[70] == Features(all_or_nothing=True)
    assert all(a == Features(all_or_nothing=True) for a in answers[70:])
    assert book.known("p") == Features(all_or_nothing=True)


def test_the_pause_stops_growing_at_its_most() -> None:
    client = Flaky(failures=10**6)
    book = FeatureBook({"p": client})  # type: ignore[dict-item]
    reads_every_second(book, 3000)
    gaps = [b - a for a, b in zip(client.asked, client.asked[1:], strict=False)]
    assert gaps[0] == RETRY_FIRST and max(gaps) == RETRY_MOST
    assert gaps[-2:] == [RETRY_MOST, RETRY_MOST]
    assert len(client.asked) < 20  # 3000 at every read


def test_each_failure_is_one_warning_naming_when_it_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    book = FeatureBook({"p": Flaky(failures=2)})  # type: ignore[dict-item]
    with caplog.at_level(logging.WARNING, logger="provisionerd.execution.provider_features"):
        reads_every_second(book, 40)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "asked again in 10 s" in lines[0] and "asked again in 20 s" in lines[1]
    assert all("exited 1 before answering" in line for line in lines)
