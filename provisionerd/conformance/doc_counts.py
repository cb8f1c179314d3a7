"""The kit's row counts as docs/controllers.md states them, made from the battery itself.

The quick start of docs/controllers.md holds, between ``<!-- kit-counts:start -->`` and ``<!-- kit-counts:end -->``,
exactly ``quick_start()``; ``tests/conformance/test_doc_counts.py`` compares the two, so adding, removing or
re-flagging a row without the doc fails a test instead of leaving a wrong number. ``python -m
provisionerd.conformance.doc_counts`` prints the block to paste.
"""

from __future__ import annotations

from collections.abc import Sequence

from provisionerd.conformance.battery import CHECKS, Check

START = "<!-- kit-counts:start -->"
END = "<!-- kit-counts:end -->"
_CONNECT = "provisionerd controller check --connect ctl-0:7400,ctl-1:7400,ctl-2:7400 --certs certs"


def _names(checks: Sequence[Check]) -> str:
    return ", ".join(f"`{c.name}`" for c in checks)


def quick_start(checks: Sequence[Check] = CHECKS) -> str:
    """The block between the markers (markers excluded): the two commands with their counts, and which rows are
    NOT RUN without ``--admin`` or with one address."""
    total = len(checks)
    admin = [c for c in checks if c.admin]
    standby = [c for c in checks if c.standby]
    return "\n".join(
        [
            "```sh",
            "provisionerd certs init certs --cluster test"
            '                # or use your own CA: see "Certificates" below',
            "# start your controller: every replica, on addresses the kit can reach, with certs/controller.pem",
            f"{_CONNECT}            # {total} rows: {total - len(admin)} run, {len(admin)} NOT RUN",
            f"{_CONNECT} --admin    # {total} rows, all run",
            "```",
            "",
            f"The kit has {total} rows. Without `--admin` the {len(admin)} rows that need it are NOT RUN"
            f" ({_names(admin)}). With one address in `--connect` the {len(standby)} row(s) that need a standby are"
            f" NOT RUN as well ({_names(standby)}): {len(admin) + len(standby)} NOT RUN with one address and no"
            " `--admin`.",
        ]
    )


def documented(text: str) -> str:
    """The block between the markers of a document's ``text`` (``ValueError`` if the markers are missing)."""
    if START not in text or END not in text:
        raise ValueError(f"no {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


if __name__ == "__main__":
    print(f"{START}\n{quick_start()}\n{END}")
