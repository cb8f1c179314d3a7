"""The wrapper a one-shot plugin runs under, so its result outlives the daemon (``provider.calls``).

Run as ``python -I -S callwrap.py <call dir> <stdout cap> <stderr keep> <durable> <plugin argv...>`` by the one-shot
transport, as the leader of a new session, with its own stdin/stdout/stderr on ``/dev/null``: it holds no pipe of
the daemon's, so a daemon killed mid-call cannot take it down (no SIGPIPE, no EOF). It

1. writes ``pid`` (its pid and start time, field 22 of ``/proc/self/stat``: a pid alone could be reused),
2. starts the plugin with stdout and stderr on pipes of its own, stdin on ``/dev/null``,
3. copies stdout into ``stdout`` (at most ``<stdout cap>`` bytes: one more and the plugin is killed, as the live
   transport did), and stderr into ``stderr`` (the last ``<stderr keep>`` bytes, at least: older output is
   dropped in batches, marked by a first line ``[earlier stderr dropped]``),
4. writes ``status`` when the plugin ends (``{"exit": n}``, ``{"signal": n}`` or ``{"exec_error": ...}``, and
   ``"too_large": true`` when stdout went over the cap), atomically, and exits the way the plugin did.

``<durable>`` is ``1`` for a mutation (its answer must survive a crash of the machine too: ``stdout`` and
``status`` are fsync'd) and ``0`` for a read (an fsync costs tens of milliseconds on a busy disk; the page cache
survives the death of the daemon, which is what this is for).

It ignores SIGTERM, SIGINT and SIGHUP (the daemon's SIGTERM to the group is for the plugin; the wrapper stays to
record how it ended); the plugin starts with every signal at its default. Standard library only, no site packages:
it must start fast and must not depend on the daemon's environment (it imports only the one atomic writer,
``plugin_sdk.atomic``, from its own package). Every file it creates is mode 0600.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

if not __package__:  # run as a file (-I -S, argv[0] is this file): its package's root is three directories up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))))
from provisionerd.plugin_sdk.atomic import write_private  # noqa: E402 - os and itertools only: no start-up cost

DROPPED = b"[earlier stderr dropped]\n"
_CHUNK = 65536
_EOF_GRACE = 1.0  # seconds to wait for EOF after the plugin exited (a leftover child may hold the pipe open)


def _open(path: str, flags: int) -> int:
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


DURABLE = False  # set from argv in main


def _json(document: dict) -> str:
    """A flat JSON object of ints, bools and plain strings (``json`` itself costs 20+ ms of import per call)."""
    parts = []
    for key, value in document.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        else:
            clean = "".join(ch if ch.isprintable() and ch not in '"\\' else " " for ch in str(value))
            text = f'"{clean}"'
        parts.append(f'"{key}": {text}')
    return "{" + ", ".join(parts) + "}"


def _write_atomic(directory: str, name: str, document: dict) -> None:
    write_private(os.path.join(directory, name), _json(document).encode(), durable=DURABLE)


def _starttime(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        text = handle.read().decode(errors="replace")
    return int(text[text.rfind(")") + 2 :].split()[19])


class _Copy(threading.Thread):
    def __init__(self, source: int, path: str, cap: int, *, tail: bool, child: int = 0) -> None:
        """``child``: the plugin's pid, killed when its output passes ``cap`` (0: nobody to kill)."""
        super().__init__(daemon=True)
        self.source, self.cap, self.tail, self.child = source, cap, tail, child
        self.fd = _open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        self.size = 0
        self.too_large = False

    def run(self) -> None:
        try:
            while chunk := os.read(self.source, _CHUNK):
                if self.tail:
                    self._keep_tail(chunk)
                elif self.size + len(chunk) > self.cap:
                    os.write(self.fd, chunk[: self.cap - self.size + 1])
                    self.too_large = True
                    self._kill_child()
                    return
                else:
                    os.write(self.fd, chunk)
                    self.size += len(chunk)
        except OSError:
            return

    def _kill_child(self) -> None:
        if not self.child:
            return
        try:
            os.kill(self.child, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _keep_tail(self, chunk: bytes) -> None:
        os.write(self.fd, chunk)
        self.size += len(chunk)
        if self.size > 2 * self.cap:
            keep = os.pread(self.fd, self.cap, self.size - self.cap)
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, DROPPED + keep, 0)
            os.lseek(self.fd, 0, os.SEEK_END)
            self.size = len(DROPPED) + len(keep)

    def finish(self) -> None:
        try:
            if DURABLE and not self.tail:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


def main(argv: list[str]) -> int:
    global DURABLE
    directory, cap, keep, DURABLE, plugin = argv[1], int(argv[2]), int(argv[3]), argv[4] == "1", argv[5:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)  # a handler, not SIG_IGN: exec resets it to the default
    me = os.getpid()
    _write_atomic(directory, "pid", {"pid": me, "starttime": _starttime(me)})
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the plugin
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; a plugin must not inherit it
                signal.signal(signum, signal.SIG_DFL)
            os.execve(plugin[0], plugin, os.environ)
        except OSError as exc:
            _write_atomic(directory, "status", {"exec_error": exc.strerror or str(exc), "errno": exc.errno})
            os._exit(127)
    os.close(out_w)
    os.close(err_w)
    # Made after the fork: the plugin inherits neither output file (only its pipes).
    out = _Copy(out_r, os.path.join(directory, "stdout"), cap, tail=False, child=pid)
    err = _Copy(err_r, os.path.join(directory, "stderr"), keep, tail=True)
    out.start()
    err.start()
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    out.join(_EOF_GRACE)
    err.join(_EOF_GRACE)
    out.finish()
    err.finish()
    if os.path.exists(os.path.join(directory, "status")):  # the exec failed: already recorded
        return 127
    status: dict = {"signal": -code} if code < 0 else {"exit": code}
    if out.too_large:
        status["too_large"] = True
    _write_atomic(directory, "status", status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(me, -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
