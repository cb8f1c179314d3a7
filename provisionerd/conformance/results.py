"""The kit's one result type: a named row, PASS, FAIL or NOT RUN, with its evidence.

A row that could not be run (no certificate for a role, one address only, no ``--admin``) is ``NOT_RUN`` with the
reason, never ``PASS``: the kit says what it checked and nothing more.
"""

from __future__ import annotations

import enum

import attrs


class Status(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    NOT_RUN = "NOT RUN"


@attrs.frozen
class Row:
    """One check's outcome. ``rule``: the controller rule it checks (docs/controllers.md), ``seconds``: its time."""

    name: str
    rule: str
    status: Status
    evidence: str
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "rule": self.rule,
            "status": self.status.value,
            "evidence": self.evidence,
            "seconds": round(self.seconds, 3),
        }


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the row's evidence."""


class NotRun(Exception):
    """A check cannot run here (a missing certificate, one address, no admin); the message says why."""
