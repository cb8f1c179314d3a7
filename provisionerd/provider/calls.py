"""Per-call directories of the one-shot transport: a plugin call whose result outlives the daemon (issue 19 item 1).

Each call gets a directory ``<root>/<id>/`` (0700; every file 0600)::

    call.json   written before the plugin starts (fsync'd for a mutation): action, op, key, validate, deadline
    in.json     the input document (``-f`` argument of the script)
    pid         the wrapper's pid and start time (``provider.callwrap`` writes it first): identifies the process
                across a daemon restart without trusting a reused pid (as ``providers/local`` does)
    stdout      the plugin's answer (capped), stderr its last bytes
    status      how the plugin ended, written by the wrapper: ``{"exit": n}``, ``{"signal": n}``, ``{"exec_error"}``

The plugin runs under ``provider.callwrap`` in its own session with no pipe of the daemon's, so a daemon killed
mid-call neither kills it nor loses what it prints. On the next start the owner of the root (``CallDirs.owned``:
an exclusive ``flock`` on ``<root>/.lock``, held for the life of the process, so a second process over the same
config -- ``provisionerd orphans`` next to a running daemon -- never touches the daemon's calls) finds the calls
left behind (``leftovers``): finished (``status`` present), still running (``pid`` names a live process with that
start time: waited for until its recorded deadline, then its group is killed), lost (the wrapper died without a
status), or never started (no ``pid``). ``provider.oneshot`` turns each into the answer or error the call would
have had; the directory is removed once its result is taken.

The deadline is a wall-clock time on purpose: it must mean the same to the next process. It is converted to the
trio clock once, where a wait starts (``Leftover.remaining``).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd.telemetry.files import make_private_dir, open_private

log = logging.getLogger(__name__)


def _wrapper_path() -> Path:
    """Where ``provider.callwrap`` is installed (run as a file: ``-I -S`` starts faster than importing the package)."""
    spec = importlib.util.find_spec("provisionerd.provider.callwrap")
    if spec is None or spec.origin is None:
        raise ImportError("provisionerd.provider.callwrap is not installed as a file")
    return Path(spec.origin)


WRAPPER = _wrapper_path()
MAX_LEFTOVERS = 10_000  # call directories looked at on a start (bounded work on a flooded directory)
_MAX_RECORD = 64 << 10  # bytes of call.json / pid / status read


def write_private(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to a new 0600 file (and fsync it when ``durable``)."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_json_file(path: Path) -> Any:
    """The JSON in ``path``; ``None`` when it is missing, too large or not JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_RECORD + 1)
    except OSError:
        return None
    if len(data) > _MAX_RECORD:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def process_starttime(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (None: no such process, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None


@attrs.define(eq=False)
class CallDir:
    """One call's directory. ``temporary``: not under an owned root (removed whatever happens)."""

    path: Path
    temporary: bool = False

    @property
    def infile(self) -> Path:
        return self.path / "in.json"

    def record(self) -> dict[str, Any]:
        found = read_json_file(self.path / "call.json")
        return found if isinstance(found, dict) else {}

    def identity(self) -> tuple[int, int] | None:
        """The wrapper's ``(pid, starttime)`` as it recorded them (None: it never started)."""
        found = read_json_file(self.path / "pid")
        if not isinstance(found, dict):
            return None
        pid, start = found.get("pid"), found.get("starttime")
        if not isinstance(pid, int) or not isinstance(start, int) or pid <= 1:
            return None
        return pid, start

    def status(self) -> dict[str, Any] | None:
        found = read_json_file(self.path / "status")
        return found if isinstance(found, dict) else None

    def running(self) -> bool:
        """The wrapper is alive: the very process that recorded its pid (same start time), not a reused pid."""
        ident = self.identity()
        return ident is not None and process_starttime(ident[0]) == ident[1]

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@attrs.define(eq=False)
class Leftover:
    """A call an earlier process started and did not collect."""

    dir: CallDir
    action: str
    op: str
    key: str
    validate: bool
    deadline: float  # wall clock (epoch seconds)
    secrets: tuple[str, ...] = ()

    def ended(self) -> bool:
        """The call is over: its status is written (the wrapper may still be exiting), or its wrapper is gone."""
        return self.dir.status() is not None or not self.dir.running()

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.time())

    async def wait(self, poll: float = 0.2) -> bool:
        """Wait until the wrapper has ended or the deadline passed; True when it ended. At the deadline the
        wrapper's group is killed (only if it is still the same process). A poll: the wrapper is not our child."""
        with trio.move_on_after(self.remaining()):
            while not self.ended():  # noqa: ASYNC110 - nothing tells a process that a non-child has exited
                await trio.sleep(poll)
            return True
        ident = self.dir.identity()
        if ident is not None and process_starttime(ident[0]) == ident[1]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(ident[0], signal.SIGKILL)
        return False


@attrs.frozen
class Collected:
    """What became of a leftover call: its answer (``document``), its typed error, or ``started`` False (the
    plugin never ran: nothing happened). ``stdout`` is what it printed (a requestId before a hang)."""

    action: str
    op: str
    key: str
    document: Any = None
    error: Exception | None = None
    started: bool = True
    stdout: bytes = b""


class CallDirs:
    """The call directories of one provider. ``root`` empty: every call in a fresh temporary directory, nothing
    survives a restart (no ``[daemon] state_dir``). A root another process holds (its lock) is not used either."""

    def __init__(self, root: str, provider: str) -> None:
        self.provider = provider
        self.root: Path | None = None
        self._lock_fd: int | None = None
        if root:
            self._own(Path(root))

    @property
    def owned(self) -> bool:
        return self.root is not None

    def _own(self, root: Path) -> None:
        try:
            make_private_dir(root)
            fd = open_private(root / ".lock", os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            log.warning(
                "provider %s: call directory %s unusable (%s); calls will not survive a restart",
                self.provider,
                root,
                exc,
            )
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            log.info(
                "provider %s: %s belongs to another process; this one's calls use temporary directories",
                self.provider,
                root,
            )
            return
        self.root, self._lock_fd = root, fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd, self.root = None, None

    def create(
        self,
        action: str,
        document: Mapping[str, Any],
        *,
        op: str,
        key: str,
        validate: bool,
        timeout: float,
        secrets: Collection[str] = (),
        durable: bool = True,
        temporary: bool = False,
    ) -> CallDir:
        """A new call's directory with its record and input written (fsync'd when ``durable``: a mutation) before
        anything runs.
        ``secrets`` (the join tokens the input carries, in clear in ``in.json`` next to it anyway) are kept so
        that whoever collects the call redacts them from what it reports. ``temporary``: a call nothing of which
        must survive us (a read): a fresh temporary directory even under an owned root."""
        if self.root is None or temporary:
            call = CallDir(Path(tempfile.mkdtemp(prefix="provisionerd-call-")), temporary=True)  # 0700, ours alone
        else:
            call = CallDir(self.root / f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}")
            make_private_dir(call.path)
        record = {
            "action": action,
            "op": op,
            "key": key,
            "validate": validate,
            "deadline": time.time() + timeout,
            "secrets": sorted(set(secrets)),
        }
        durable = durable and not call.temporary
        write_private(call.infile, json.dumps(document, separators=(",", ":")).encode(), durable=durable)
        write_private(call.path / "call.json", json.dumps(record).encode(), durable=durable)
        return call

    def leftovers(self) -> list[Leftover]:
        """The calls in the root no process collected (oldest first; at most ``MAX_LEFTOVERS``). A directory
        without a readable record never started a plugin (the record is written first): it is removed."""
        if self.root is None:
            return []
        found: list[Leftover] = []
        try:
            names = sorted(n for n in os.listdir(self.root) if not n.startswith("."))
        except OSError as exc:
            log.warning("provider %s: cannot read %s: %s", self.provider, self.root, exc)
            return []
        if len(names) > MAX_LEFTOVERS:
            log.warning(
                "provider %s: %d call directories in %s; looking at the oldest %d",
                self.provider,
                len(names),
                self.root,
                MAX_LEFTOVERS,
            )
        for name in names[:MAX_LEFTOVERS]:
            call = CallDir(self.root / name)
            record = call.record()
            deadline = record.get("deadline")
            if not isinstance(record.get("action"), str) or not isinstance(deadline, int | float):
                call.remove()
                continue
            found.append(
                Leftover(
                    call,
                    record["action"],
                    str(record.get("op", "")),
                    str(record.get("key", "")),
                    bool(record.get("validate", True)),
                    float(deadline),
                    tuple(s for s in record.get("secrets", ()) if isinstance(s, str)),
                )
            )
        return found
