"""The guard that keeps the tiers true (tests/conftest.py), run on a small test file of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

GUARD = Path(__file__).with_name("conftest.py")

SAMPLE = """
import os
import subprocess

import pytest


def test_unmarked_swallows_the_error():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass


def test_unmarked_forks():
    try:
        pid = os.fork()
    except Exception:
        return
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


@pytest.mark.process
def test_marked_process():
    subprocess.run(["true"], check=True)


@pytest.mark.integration
def test_marked_integration():
    subprocess.run(["true"], check=True)


def test_pure():
    assert sum(range(4)) == 6
"""


@pytest.mark.process
def test_a_test_that_starts_a_process_without_a_marker_fails_naming_the_command(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(GUARD.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    process: p\n    integration: i\n")
    pytester.makepyfile(test_sample=SAMPLE)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_unmarked_swallows_the_error started 1 process(es) without the 'process' or 'integration'"
            " marker: true*",
            "*test_unmarked_forks started 1 process(es) without*os.fork()*",
        ]
    )
