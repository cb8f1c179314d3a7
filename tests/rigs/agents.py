"""``provisionerd agent`` as a machine's boot script starts it: a secret in a file the agent deletes once read, the
controllers and who the machine is (``--instance-ref`` for a join token, ``--address-bound --machine-id`` for the
address-bound join), its output in ``agent.log`` in the machine's home.

The tests that play a cloud's machine image (the EC2 emulator boots nothing, the LSF example's machines are
records) start one per machine through the test's ``procs.Procs``, so each is stopped when the test ends.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rigs import procs

HEARTBEAT = 0.5


def token_file(home: Path, secret: str, name: str = "join-token") -> Path:
    """``secret`` in a new 0600 file ``home/name`` (``home`` made 0700 if missing), as an image writes it."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret)
    return path


def argv(certs: Path, controllers: Sequence[str], token: Path, *who: str, heartbeat: float = HEARTBEAT) -> list[str]:
    """The agent's command line: worker certificates ``certs``, ``who`` (``--instance-ref REF``, or
    ``--address-bound --machine-id ID``), the secret read from the file ``token``."""
    return procs.provisionerd(
        "agent",
        "--certs",
        certs,
        "--controllers",
        ",".join(controllers),
        *who,
        "--token-file",
        token,
        "--heartbeat",
        str(heartbeat),
    )


async def boot(
    started: procs.Procs, home: Path, certs: Path, controllers: Sequence[str], token: Path, *who: str
) -> procs.Proc:
    """Start the agent of the machine whose home is ``home`` (its log: ``home/agent.log``)."""
    return await started.start(f"agent-{home.name}", argv(certs, controllers, token, *who), home / "agent.log")
