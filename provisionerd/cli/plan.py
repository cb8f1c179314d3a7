"""``provisionerd plan --what-if FILE``: see :mod:`provisionerd.cli.explain` (one module renders both)."""

from __future__ import annotations

from provisionerd.cli.explain import plan_main


def main(argv: list[str]) -> int:
    return plan_main(argv)
